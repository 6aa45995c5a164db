"""Process helpers for the exec-agent tests."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def kill_exec_shim(init_pid: int, settle: float = 0.2) -> int:
    """SIGKILL the exec agent's per-command shim under `init_pid` (its first descendant that is
    not the `sleep` it runs) once it is running; returns its pid."""
    from rollstack.run import procs

    deadline = time.monotonic() + 30  # a generous wait on a condition, not a speed assertion
    while time.monotonic() < deadline:
        kids = [q for q in procs.descendants(init_pid) if b"sleep" not in _cmdline(q)]
        if kids:
            time.sleep(settle)
            try:
                os.kill(kids[0], signal.SIGKILL)
                return kids[0]
            except ProcessLookupError:  # a previous command's shim that was just ending: look again
                continue
        time.sleep(0.02)
    raise AssertionError(f"no exec shim appeared under pid {init_pid}")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone meanwhile
        return b"sleep"


def assert_tree_gone(env, *markers: bytes, settle: float = 0.2) -> None:
    """No process in `env` whose command line holds one of `markers` (after `settle` s)."""
    time.sleep(settle)
    ps = env.exec(["ps", "-o", "args"]).stdout
    assert not any(m in ps for m in markers), ps
