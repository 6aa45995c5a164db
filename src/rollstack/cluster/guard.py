"""`python -m rollstack.cluster.guard -- ARGV...`: run ARGV so that it outlives Ray's cleanup
long enough to stop gracefully.

When a Ray worker exits or its node goes away, Ray SIGKILLs the worker's direct children; an agent
killed that way leaves its environments' mounts, cgroups and lazy store daemon behind. So the
actor starts this guard instead, and the guard starts the agent in its own session with
PR_SET_PDEATHSIG=SIGTERM: whatever ends the guard (Ray's SIGKILL, the worker's death through the
guard's own PDEATHSIG, or a SIGTERM it forwards), the agent gets SIGTERM and stops gracefully
(destroys its environments, unmounts, ends its daemon). The guard exits with the agent's status.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: SIGTERM this child when the thread that forked it dies."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "--" or len(argv) < 2:
        print("usage: python -m rollstack.cluster.guard -- ARGV...", file=sys.stderr)
        return 2
    proc = subprocess.Popen(argv[1:], start_new_session=True, preexec_fn=die_with_parent)

    def forward(_sig: int, _frame: object) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    while True:
        try:
            return proc.wait()
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
            continue


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
