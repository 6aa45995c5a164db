"""Recovery after a crashed agent, the node's part: the lazy store daemon it left behind.

The runtime's leftovers (env dirs, runc state, overlay mounts, cgroups) are found and destroyed by
`EnvironmentRuntime.cleanup_leftovers()`; this module ends a lazy store daemon still serving the
node's mountpoint (it runs in its own session, so it outlives a crashed agent), so that the new
daemon never stacks on it, nor gets unmounted by the old one's exit.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)


def daemon_pids(mountpoint: Path) -> list[int]:
    """Pids of lazy store daemons serving `mountpoint` (found by their command line)."""
    needle = os.fsencode(str(Path(mountpoint).absolute()))
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                argv = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"rollstack.mount.daemon" in argv and needle in argv:
                pids.append(int(d.name))
    return pids


def end_orphan_daemon(mountpoint: Path, state_dir: Path, wait: float = 10.0) -> None:
    """End a lazy store daemon a crashed agent left serving `mountpoint` (its environments are
    already destroyed), so the new daemon never stacks on it or gets unmounted by its exit."""
    from rollstack.mount.client import LazyStoreClient

    pids = daemon_pids(mountpoint)
    if not pids:
        return
    log.warning("ending lazy store daemon(s) %s left at %s by a previous run", pids, mountpoint)
    LazyStoreClient.connect(mountpoint, state_dir).stop()  # asks it to unmount and exit
    deadline = time.monotonic() + wait
    while daemon_pids(mountpoint) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in daemon_pids(mountpoint):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
