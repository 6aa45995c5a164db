"""A cgroup for a node's background work (layer materialization): a CPU cap and the lowest weight.

SCHED_IDLE and nice 19 make a process yield to environments on its own CPU, but not bound what
it takes while a core looks free, and on cgroup v1 a process in the root cgroup competes with the
environments' cgroups as one more root-level task. A background cgroup adds both bounds the
kernel enforces: `cpu` cores at most (CFS quota: v1 `cpu.cfs_quota_us`, v2 `cpu.max`) and the
smallest share against everything else (v1 `cpu.shares` 2, v2 `cpu.weight` 1). It lives beside
the environments' tree (`<hierarchy>/rollstack-background-<tag>`, never under `rollstack/`, whose
children recovery treats as environments), one per node (`tag`), under every hierarchy that has
the cpu controller; its processes join it themselves (`join`).
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from rollstack.host.cgroups import cgroup_mounts

log = logging.getLogger(__name__)

PREFIX = "rollstack-background-"
PERIOD_US = 100_000


def settings(cpu: float, version: int) -> dict[str, str]:
    """The files to write for a cap of `cpu` cores (0: no cap, lowest weight only) (pure)."""
    if cpu < 0:
        raise ValueError(f"cpu cap must be >= 0, not {cpu}")
    quota = int(cpu * PERIOD_US) if cpu else 0
    if version == 1:
        out = {"cpu.shares": "2", "cpu.cfs_period_us": str(PERIOD_US)}
        out["cpu.cfs_quota_us"] = str(max(quota, 1000)) if cpu else "-1"
        return out
    return {"cpu.weight": "1", "cpu.max": f"{max(quota, 1000)} {PERIOD_US}" if cpu else f"max {PERIOD_US}"}


def _cpu_roots(mounts: list[tuple[str, str]]) -> list[tuple[Path, int]]:
    """(hierarchy root, cgroup version) of every hierarchy where the cpu controller is."""
    out = []
    for mp, fstype in mounts:
        root = Path(mp)
        if fstype == "cgroup" and (root / "cpu.cfs_quota_us").exists():
            out.append((root, 1))
        elif fstype == "cgroup2":
            try:
                if "cpu" in (root / "cgroup.controllers").read_text().split():
                    out.append((root, 2))
            except OSError:
                continue
    return out


def create(tag: str, cpu: float, mounts: list[tuple[str, str]] | None = None) -> list[Path]:
    """Make (or reuse) this node's background cgroup with a cap of `cpu` cores; its dirs. Where
    the kernel refuses (no cpu controller, not root) it logs and returns what it could make:
    background work then runs with its process priorities only."""
    if not tag or "/" in tag or tag.startswith("."):
        raise ValueError(f"bad background cgroup tag {tag!r}")
    made = []
    for root, version in _cpu_roots(cgroup_mounts() if mounts is None else mounts):
        cg = root / f"{PREFIX}{tag}"
        try:
            if version == 2:  # the cpu controller must be enabled for the root's children
                ctl = root / "cgroup.subtree_control"
                if "cpu" not in ctl.read_text().split():
                    ctl.write_text("+cpu")
            cg.mkdir(exist_ok=True)
            for name, value in settings(cpu, version).items():
                (cg / name).write_text(value)
            made.append(cg)
        except OSError as e:
            log.warning("background cgroup %s not made (%s): background work is not capped", cg, e.strerror)
    return made


def join(dirs: list[Path], pid: int = 0) -> None:
    """Move `pid` (0: the calling process) into every cgroup of `dirs`."""
    for cg in dirs:
        (Path(cg) / "cgroup.procs").write_text(str(pid or os.getpid()))


def remove(dirs: list[Path]) -> None:
    """rmdir the background cgroups (a busy one, still holding a process, stays)."""
    for cg in dirs:
        try:
            Path(cg).rmdir()
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.EBUSY):
                log.warning("background cgroup %s not removed: %s", cg, e.strerror)
