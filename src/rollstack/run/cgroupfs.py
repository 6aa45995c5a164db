"""Removing one environment's cgroup directories (v1 and v2; finding them is `rollstack.host.cgroups`).

runc's cgroupfs driver creates `<mount>/<parent>/<env-id>` under EVERY mounted hierarchy: each
v1 controller, named v1 hierarchies (`name=systemd`) and, on hybrid hosts, the v2 `unified`
mount too. `runc delete` normally removes them; after a crash or a failed start we must.
The quota policy lives in `rollstack.provision`.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path

# Where the dirs are, their OOM counters and memory.stat are host facts; re-exported for run.
from rollstack.host.cgroups import cgroup_mounts, env_cgroup_dirs, oom_kills, stat_value  # noqa: F401


def cgroup_procs(cg: Path) -> list[int]:
    """Pids in `cg` and its sub-cgroups."""
    return _procs(cg)


def _procs(cg: Path) -> list[int]:
    pids: list[int] = []
    for sub, _dirs, _files in os.walk(cg):
        try:
            pids.extend(int(x) for x in (Path(sub) / "cgroup.procs").read_text().split())
        except (OSError, ValueError):
            pass
    return pids


RELEASE_BELOW = 1 << 20
"""Bytes of page cache under which an emptied memory cgroup is reclaimed before its rmdir."""


def release_page_cache(cg: Path, below: int = RELEASE_BELOW) -> bool:
    """Uncharge the page cache an emptied memory cgroup still holds when it is less than `below`
    bytes, so that rmdir frees the cgroup instead of leaving it dying. True if asked for.

    A page stays charged to the cgroup of the process that first read it, and cgroup v1 does
    not move it to the parent at rmdir: the cgroup lives on, invisible, until the page is
    reclaimed. With 24 GiB free that is never, so almost every environment left one behind
    (a few KB each of files it happened to read first); node bursts left ~110 per 256 starts
    and the kernel's per-cgroup work grew with them. Reclaiming a few KB costs ~0.8 ms of CPU
    in the (asynchronous) destroy. A larger charge is kept: that is the page cache the first
    environment of a stack read, which every later one shares; its cgroup stays dying, one per
    stack rather than one per environment. v1: `memory.force_empty`; v2: `memory.reclaim`.
    Errors (tasks left: EBUSY; v2 short of the amount: EAGAIN) leave it as it was."""
    try:
        if (cg / "memory.force_empty").exists():  # v1: reclaims everything charged
            cached = stat_value((cg / "memory.stat").read_text(), "total_cache", "cache")
            target, amount = cg / "memory.force_empty", "0"
        elif (cg / "memory.reclaim").exists():  # v2: reclaims the amount written
            cached = stat_value((cg / "memory.stat").read_text(), "file")
            target, amount = cg / "memory.reclaim", (cg / "memory.current").read_text().strip()
            if amount == "0":
                return False
        else:
            return False
        if cached is None or cached >= below:
            return False
        target.write_text(amount)
        return True
    except OSError:
        return False


def remove_cgroup(cg: Path, attempts: int = 50) -> None:
    """rmdir `cg` and its sub-cgroups (deepest first), killing stragglers in it if busy."""
    for _ in range(attempts):
        try:
            subdirs = sorted((Path(d) for d, _, _ in os.walk(cg)), key=lambda p: -len(p.parts))
        except OSError:
            return
        busy = False
        for d in subdirs:
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno != errno.EBUSY:
                    raise
                busy = True
        if not busy and not cg.exists():
            return
        for pid in _procs(cg):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    if cg.exists():
        raise OSError(errno.EBUSY, f"cgroup still busy: {cg}")
