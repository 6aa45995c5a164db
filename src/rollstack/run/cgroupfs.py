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

# Where the dirs are and their OOM counters are host facts; re-exported for run.environment.
from rollstack.host.cgroups import cgroup_mounts, env_cgroup_dirs, oom_kills  # noqa: F401


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
