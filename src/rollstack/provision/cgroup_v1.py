"""`CgroupV1`: the legacy hierarchy (this host): `cpu`, `cpuacct`, `memory`, `pids` mounted apart.

An environment's cgroup is the same relative path under each controller. rollstack sets
`memory.oom_control` oom_kill_disable=1 so a task that reaches its limit is *paused* (`under_oom
1`) instead of killed, which gives the controller a sample period to grow the limit. v1 has no
`memory.high`: the `high` argument is ignored. Lowering `memory.limit_in_bytes` under usage fails
with EBUSY after the kernel's reclaim attempts; `set_memory` then keeps the old limit and says so.

On hybrid hosts (v1 controllers plus an empty v2 mount at `<root>/unified`) runc also places the
container in the v2 tree; if that directory exists, PSI totals are read from it.
"""

from __future__ import annotations

import errno
import time
from pathlib import Path

from rollstack.errors import InvalidRequest, RuntimeFailure
from rollstack.provision._files import (
    UNLIMITED_V1,
    FdCache,
    parse_psi_some_total,
    read_text,
    write_text,
)
from rollstack.provision.backend import CFS_PERIOD_US, CgroupBackend
from rollstack.provision.sample import CgroupSample

CONTROLLERS = ("cpu", "cpuacct", "memory", "pids")

OOM_CHECK_FRACTION = 0.9
"""memory.oom_control is read when usage >= this fraction of the limit (and on the first sample)."""


class CgroupV1(CgroupBackend):
    """Elastic control through v1 files; `root` is where the controller hierarchies are mounted."""

    version = 1

    def __init__(self, root: Path = Path("/sys/fs/cgroup"), *, use_unified_psi: bool = False) -> None:
        self.root = Path(root)
        # Off by default: two more reads per sample (~25% of the sampling cost) for a signal that
        # under_oom and failcnt already give on v1.
        self.use_unified_psi = use_unified_psi and (self.root / "unified" / "cgroup.procs").exists()
        self._cache: dict[str, FdCache] = {}
        # Values rollstack wrote itself are remembered rather than re-read on every sample.
        self._cpu_limits: dict[str, float | None] = {}
        self._mem_limits: dict[str, int] = {}
        self._oom: dict[str, tuple[bool, int]] = {}

    # -- layout --------------------------------------------------------------------------------
    def dir(self, controller: str, path: str) -> Path:
        return self.root / controller / _rel(path)

    def _controller_dirs(self, path: str) -> list[Path]:
        seen: set[Path] = set()
        out: list[Path] = []
        for c in CONTROLLERS:
            base = self.root / c
            if not base.exists():
                continue
            d = base.resolve() / _rel(path)  # co-mounted `cpu,cpuacct` appear once
            if d not in seen:
                seen.add(d)
                out.append(d)
        if self.use_unified_psi:
            out.append(self.root / "unified" / _rel(path))
        return out

    def _dirs(self, path: str) -> list[Path]:
        return [d for d in self._controller_dirs(path) if d.exists()]

    # -- lifecycle -----------------------------------------------------------------------------
    def create(self, path: str) -> None:
        for d in self._controller_dirs(path):
            d.mkdir(parents=True, exist_ok=True)
        write_text(self.dir("memory", path) / "memory.oom_control", "1")
        write_text(self.dir("cpu", path) / "cpu.cfs_period_us", str(CFS_PERIOD_US))

    def exists(self, path: str) -> bool:
        return self.dir("memory", path).is_dir() or self.dir("cpu", path).is_dir()

    def procs(self, path: str) -> list[int]:
        pids: set[int] = set()
        for d in self._dirs(path):
            try:
                pids.update(int(x) for x in read_text(d / "cgroup.procs").split())
            except FileNotFoundError:
                pass
        return sorted(pids)

    def add_proc(self, path: str, pid: int) -> None:
        for d in self._controller_dirs(path):
            write_text(d / "cgroup.procs", str(pid))

    def forget(self, path: str) -> None:
        entry = self._cache.pop(path, None)
        if entry:
            entry.close()
        self._cpu_limits.pop(path, None)
        self._mem_limits.pop(path, None)
        self._oom.pop(path, None)

    # -- limits --------------------------------------------------------------------------------
    def set_cpu(self, path: str, cores: float | None) -> None:
        quota = -1 if cores is None else max(1000, int(round(cores * CFS_PERIOD_US)))
        write_text(self.dir("cpu", path) / "cpu.cfs_quota_us", str(quota))
        self._cpu_limits[path] = None if quota < 0 else quota / CFS_PERIOD_US

    def set_memory(self, path: str, limit_bytes: int, high: int | None = None) -> int:
        target = self.dir("memory", path) / "memory.limit_in_bytes"
        try:
            write_text(target, str(int(limit_bytes)))
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise RuntimeFailure(f"cannot set memory limit of {path}: {exc}", path=path) from exc
            # The kernel reclaimed what it could and usage is still above the new limit: the old
            # limit stays. The caller sees the limit in force and records the refusal.
        applied = int(read_text(target))
        self._mem_limits[path] = applied
        self._oom.pop(path, None)  # re-read oom_control on the next sample
        return applied

    def set_memory_quota(self, path: str, quota: int, cap: int) -> int:
        return self.set_memory(path, quota)

    def set_oom_kill(self, path: str, enabled: bool) -> None:
        """Let the kernel OOM-kill at the limit (fixed-quota baselines) or pause instead (elastic)."""
        write_text(self.dir("memory", path) / "memory.oom_control", "0" if enabled else "1")

    def _unlimit_memory(self, path: str) -> None:
        write_text(self.dir("memory", path) / "memory.limit_in_bytes", "-1")
        self._mem_limits.pop(path, None)

    def set_pids(self, path: str, max_pids: int | None) -> None:
        d = self.dir("pids", path)
        if d.exists():
            write_text(d / "pids.max", "max" if max_pids is None else str(int(max_pids)))

    # -- sampling ------------------------------------------------------------------------------
    def _files(self, path: str) -> FdCache:
        entry = self._cache.get(path)
        if entry is None:
            mem = self.dir("memory", path)
            files = [
                self.dir("cpuacct", path) / "cpuacct.usage",
                self.dir("cpu", path) / "cpu.stat",
                mem / "memory.usage_in_bytes",
                mem / "memory.failcnt",
            ]
            uni = self.root / "unified" / _rel(path)
            if self.use_unified_psi and (uni / "memory.pressure").exists():
                files += [uni / "memory.pressure", uni / "cpu.pressure"]
            entry = FdCache(tuple(files))
            self._cache[path] = entry
        return entry

    def sample(self, path: str, now: float | None = None) -> CgroupSample:
        cache = self._cache.get(path) or self._files(path)
        try:
            raw = cache.read_all()
        except OSError:
            self.forget(path)  # gone (ENODEV/ENOENT): drop descriptors, let the caller decide
            raise
        # cpu.stat has a fixed key order on v1 ("nr_periods N nr_throttled N throttled_time N ...");
        # split() is 3x cheaper than building a dict, and the keys are checked so a different
        # kernel fails loudly.
        cpu = raw[1].split()
        if cpu[0] != b"nr_periods" or cpu[4] != b"throttled_time":
            raise RuntimeFailure(f"unexpected cpu.stat layout in {path}", path=path)
        if path not in self._cpu_limits:
            q = int(read_text(self.dir("cpu", path) / "cpu.cfs_quota_us"))
            self._cpu_limits[path] = None if q < 0 else q / CFS_PERIOD_US
        limit = self._mem_limits.get(path)
        if limit is None:
            limit = self._mem_limits[path] = int(read_text(self.dir("memory", path) / "memory.limit_in_bytes"))
        usage = int(raw[2])
        # Tasks can only be paused under OOM (and the kernel can only OOM-kill) with usage at the
        # limit, so oom_control is read only near it, while it last said under_oom, and after a
        # limit change: 4 reads per sample instead of 5 in the common case.
        cached = self._oom.get(path)
        if cached is None or cached[0] or usage >= limit * OOM_CHECK_FRACTION:
            oom = read_text(self.dir("memory", path) / "memory.oom_control").split()
            if oom[2] != "under_oom":
                raise RuntimeFailure(f"unexpected memory.oom_control layout in {path}", path=path)
            self._oom[path] = (oom[3] != "0", int(oom[5]) if len(oom) > 5 else 0)
        under_oom, oom_kills = self._oom[path]
        return CgroupSample(
            t=time.monotonic() if now is None else now,
            cpu_usage_ns=int(raw[0]),
            nr_periods=int(cpu[1]),
            nr_throttled=int(cpu[3]),
            throttled_ns=int(cpu[5]),
            memory_usage=usage,
            memory_limit=limit,
            failcnt=int(raw[3]),
            oom_kill_count=oom_kills,
            under_oom=under_oom,
            pressure_total_us=parse_psi_some_total(raw[4]) if len(raw) > 4 else None,
            cpu_pressure_total_us=parse_psi_some_total(raw[5]) if len(raw) > 5 else None,
            cpu_limit=self._cpu_limits[path],
        )

    def oom_kills(self, path: str) -> int:
        """The cgroup's OOM-kill count, read now (sample() refreshes it only near the limit)."""
        oom = read_text(self.dir("memory", path) / "memory.oom_control").split()
        return int(oom[5]) if len(oom) > 5 else 0


def _rel(path: str) -> str:
    """A cgroup path relative to a hierarchy root; refuses empty paths and `..`."""
    rel = str(path).strip("/")
    if not rel or ".." in rel.split("/"):
        raise InvalidRequest(f"bad cgroup path {path!r}", path=str(path))
    return rel


__all__ = ["CgroupV1", "UNLIMITED_V1", "CONTROLLERS"]
