"""The FUSE-serving thread's CPU priority (`--fuse-priority`).

Every FUSE request is a round trip: the requesting process sleeps until the daemon's trio thread
has been scheduled, read the request and answered. The daemon does little CPU work per request
(~20 us), but on a busy 2-core node each wakeup can wait for a time slice, so a command making
thousands of requests (overlayfs probes `trusted.overlay.*` on every lower inode of every new
overlay mount, and the kernel caches no xattr answer) waits milliseconds per request. So the
thread that serves FUSE runs at a high priority and wakes at once:

- `rr` (default): SCHED_RR priority 1 for the calling thread only, with SCHED_RESET_ON_FORK, so
  the threads it starts later (trio's worker threads: chunk decoding, disk cache writes,
  background fill) and processes it spawns run at normal priority; the kernel's RT throttling
  (95 % per period) bounds it even if it spun. Falls back to `nice` where RT is not allowed
  (a cgroup without RT runtime).
- `nice`: nice -10 for the calling thread, SCHED_RESET_ON_FORK (children start at nice 0).
- `normal`: unchanged.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

MODES = ("rr", "nice", "normal")


def raise_fuse_thread_priority(mode: str = "rr") -> str:
    """Apply `mode` to the calling thread; returns the mode in force ("normal" if refused)."""
    if mode not in MODES:
        raise ValueError(f"fuse priority must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "normal":
        return "normal"
    reset = getattr(os, "SCHED_RESET_ON_FORK", 0x40000000)
    if mode == "rr":
        try:
            os.sched_setscheduler(0, os.SCHED_RR | reset, os.sched_param(1))
            return "rr"
        except OSError as exc:
            log.info("SCHED_RR refused (%s); using nice -10 for the FUSE thread", exc)
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER | reset, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, 0, -10)  # PRIO_PROCESS with 0 = the calling thread on Linux
        return "nice"
    except OSError as exc:
        log.warning("cannot raise the FUSE thread's priority: %s", exc)
        return "normal"
