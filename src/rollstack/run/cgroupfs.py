"""Finding and removing one environment's cgroup directories (v1 and v2), reading OOM kills.

runc's cgroupfs driver creates `<mount>/<parent>/<env-id>` under EVERY mounted hierarchy: each
v1 controller, named v1 hierarchies (`name=systemd`) and, on hybrid hosts, the v2 `unified`
mount too. `runc delete` normally removes them; after a crash or a failed start we must.
The quota policy lives in `rollstack.provision`; this module only knows where the dirs are.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path

from rollstack.run.overlay import _unescape_mountinfo


def cgroup_mounts(mountinfo: str | None = None) -> list[tuple[str, str]]:
    """(mount point, "cgroup" | "cgroup2") of every cgroup hierarchy mounted here."""
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    out = []
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if "-" not in fields:
            continue
        fstype = fields[fields.index("-") + 1]
        if fstype in ("cgroup", "cgroup2"):
            out.append((_unescape_mountinfo(fields[4]), fstype))
    return out


def env_cgroup_dirs(env_id: str, parent: str = "rollstack",
                    mounts: list[tuple[str, str]] | None = None) -> list[Path]:
    """Every existing cgroup dir of `env_id` (one per hierarchy that has it)."""
    mounts = cgroup_mounts() if mounts is None else mounts
    rel = f"{parent.strip('/')}/{env_id}"
    return [Path(mp) / rel for mp, _ in mounts if (Path(mp) / rel).is_dir()]


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


def oom_kills(env_id: str, parent: str = "rollstack") -> int:
    """How many processes the kernel's OOM killer ended in this environment's memory cgroup."""
    for cg in env_cgroup_dirs(env_id, parent):
        for name, key in (("memory.oom_control", "oom_kill"), ("memory.events", "oom_kill")):
            try:
                for line in (cg / name).read_text().splitlines():
                    k, _, v = line.partition(" ")
                    if k == key:
                        return int(v)
            except OSError:
                continue
    return 0
