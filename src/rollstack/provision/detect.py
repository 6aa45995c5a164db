"""`detect_backend`: which cgroup backend this host has (v2 unified, or v1 controllers)."""

from __future__ import annotations

from pathlib import Path

from rollstack.errors import RuntimeFailure
from rollstack.provision.backend import CgroupBackend
from rollstack.provision.cgroup_v1 import CgroupV1
from rollstack.provision.cgroup_v2 import CgroupV2


def detect_backend(root: Path = Path("/sys/fs/cgroup")) -> CgroupBackend:
    """The backend for the host: v2 if `root` is a unified hierarchy, v1 if it holds controller dirs.

    A hybrid host (v1 controllers plus an empty `unified` v2 mount, like this one) is v1.
    """
    root = Path(root)
    if (root / "cgroup.controllers").exists():
        return CgroupV2(root)
    if (root / "memory" / "memory.limit_in_bytes").exists() and (root / "cpu" / "cpu.cfs_quota_us").exists():
        return CgroupV1(root)
    raise RuntimeFailure(f"no usable cgroup hierarchy under {root} (need v2, or v1 cpu+memory)", root=str(root))
