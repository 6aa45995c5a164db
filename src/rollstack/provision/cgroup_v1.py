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
import os
import time
from pathlib import Path

from rollstack.errors import InvalidRequest, RuntimeFailure
from rollstack.host.cgroups import oom_kill_count
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
"""memory.oom_control is read when usage >= this fraction of the limit (see `_Track`)."""
LAZY_MEM_FRACTION = 0.5
"""memory.failcnt is read when usage >= this fraction of the limit."""
LAZY_CPU_FRACTION = 0.2
"""cpu.stat is read when CPU use since the last sample >= this fraction of the quota."""

pread = os.pread


class CgroupV1(CgroupBackend):
    """Elastic control through v1 files; `root` is where the controller hierarchies are mounted."""

    version = 1

    def __init__(
        self, root: Path = Path("/sys/fs/cgroup"), *, use_unified_psi: bool = False, lazy: bool = True
    ) -> None:
        self.root = Path(root)
        # Off by default: two more reads per sample (~25% of the sampling cost) for a signal that
        # under_oom and failcnt already give on v1.
        self.use_unified_psi = use_unified_psi and (self.root / "unified" / "cgroup.procs").exists()
        self.lazy = lazy
        self._tracks: dict[str, _Track] = {}
        self._base_dirs: list[Path] | None = None

    # -- layout --------------------------------------------------------------------------------
    def dir(self, controller: str, path: str) -> Path:
        return self.root / controller / _rel(path)

    def _bases(self) -> list[Path]:
        """The controllers' hierarchy roots, resolved once (co-mounted `cpu,cpuacct` appear
        once): the mounts do not change under a running node, and resolving them took ~0.1 ms
        of every create, register and destroy."""
        if self._base_dirs is None:
            bases: list[Path] = []
            for c in CONTROLLERS:
                base = self.root / c
                if base.exists() and base.resolve() not in bases:
                    bases.append(base.resolve())
            self._base_dirs = bases
        return self._base_dirs

    def _controller_dirs(self, path: str) -> list[Path]:
        rel = _rel(path)
        out = [base / rel for base in self._bases()]
        if self.use_unified_psi:
            out.append(self.root / "unified" / rel)
        return out

    def _dirs(self, path: str) -> list[Path]:
        dirs = [d for d in self._controller_dirs(path) if d.exists()]
        uni = self.root / "unified" / _rel(path)
        if uni not in dirs and uni.is_dir():  # made by runc on hybrid hosts, or a PSI-reading backend
            dirs.append(uni)
        return dirs

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
        tr = self._tracks.pop(path, None)
        if tr is not None:
            tr.fds.close()

    # -- limits --------------------------------------------------------------------------------
    def set_cpu(self, path: str, cores: float | None) -> None:
        quota = -1 if cores is None else max(1000, int(round(cores * CFS_PERIOD_US)))
        write_text(self.dir("cpu", path) / "cpu.cfs_quota_us", str(quota))
        tr = self._tracks.get(path)
        if tr is not None:
            tr.cpu_limit = None if quota < 0 else quota / CFS_PERIOD_US
            tr.force_stat = True

    def set_cpu_weight(self, path: str, weight: int) -> None:
        shares = max(2, min(262144, int(weight) * 1024 // 100))  # v1 default 1024 == v2 default 100
        write_text(self.dir("cpu", path) / "cpu.shares", str(shares))

    def set_memory(self, path: str, limit_bytes: int, high: int | None = None) -> int:
        target = self.dir("memory", path) / "memory.limit_in_bytes"
        try:
            try:
                write_text(target, str(int(limit_bytes)))
            except OSError as exc:
                memsw = target.with_name("memory.memsw.limit_in_bytes")
                if exc.errno != errno.EINVAL or not memsw.exists():
                    raise
                # memory.limit must stay <= memory+swap: someone pinned memsw (e.g. a runtime
                # given a swap value). There is no swap to bound here, so lift it and retry.
                write_text(memsw, "-1")
                write_text(target, str(int(limit_bytes)))
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise RuntimeFailure(f"cannot set memory limit of {path}: {exc}", path=path) from exc
            # The kernel reclaimed what it could and usage is still above the new limit: the old
            # limit stays. The caller sees the limit in force and records the refusal.
        applied = int(read_text(target))
        tr = self._tracks.get(path)
        if tr is not None:
            tr.mem_limit = applied
            tr.oom = None  # re-read oom_control and failcnt on the next sample
            tr.failcnt = None
        return applied

    def set_memory_quota(self, path: str, quota: int, cap: int) -> int:
        return self.set_memory(path, quota)

    def set_oom_kill(self, path: str, enabled: bool) -> None:
        """Let the kernel OOM-kill at the limit (fixed-quota baselines) or pause instead (elastic)."""
        write_text(self.dir("memory", path) / "memory.oom_control", "0" if enabled else "1")

    def _unlimit_memory(self, path: str) -> None:
        write_text(self.dir("memory", path) / "memory.limit_in_bytes", "-1")
        self.forget(path)

    def set_pids(self, path: str, max_pids: int | None) -> None:
        d = self.dir("pids", path)
        if d.exists():
            write_text(d / "pids.max", "max" if max_pids is None else str(int(max_pids)))

    # -- sampling ------------------------------------------------------------------------------
    def _track(self, path: str) -> "_Track":
        mem = self.dir("memory", path)
        files = [
            self.dir("cpuacct", path) / "cpuacct.usage",
            mem / "memory.usage_in_bytes",
            self.dir("cpu", path) / "cpu.stat",
            mem / "memory.failcnt",
            mem / "memory.oom_control",
            mem / "memory.stat",
        ]
        uni = self.root / "unified" / _rel(path)
        if self.use_unified_psi and (uni / "memory.pressure").exists():
            files += [uni / "memory.pressure", uni / "cpu.pressure"]
        q = int(read_text(self.dir("cpu", path) / "cpu.cfs_quota_us"))
        tr = _Track(FdCache(tuple(files)))
        tr.cpu_limit = None if q < 0 else q / CFS_PERIOD_US
        tr.mem_limit = int(read_text(mem / "memory.limit_in_bytes"))
        self._tracks[path] = tr
        return tr

    def sample(self, path: str, now: float | None = None) -> CgroupSample:
        """Read the cgroup. With `lazy` (default) only what can have changed is read (see `_Track`)."""
        tr = self._tracks.get(path) or self._track(path)
        t = time.monotonic() if now is None else now
        try:
            fds = tr.fds.fds or tr.fds.open()
            cpu_ns = int(pread(fds[0], 64, 0))
            usage = int(pread(fds[1], 64, 0))
            limit = tr.mem_limit
            lazy = self.lazy and tr.last_t is not None
            quota = tr.cpu_limit
            if not lazy or tr.force_stat or (quota is not None and (
                (cpu_ns - tr.last_cpu_ns) >= LAZY_CPU_FRACTION * quota * (t - tr.last_t) * 1e9
            )):
                # Fixed key order on v1 ("nr_periods N nr_throttled N throttled_time N ..."):
                # split() is 3x cheaper than a dict; the keys are checked so another layout fails loudly.
                st = pread(fds[2], 4096, 0).split()
                if st[0] != b"nr_periods" or st[4] != b"throttled_time":
                    raise RuntimeFailure(f"unexpected cpu.stat layout in {path}", path=path)
                stat = (int(st[1]), int(st[3]), int(st[5]))
                tr.force_stat = tr.stat is not None and stat[1] > tr.stat[1]  # keep reading while throttled
                tr.stat = stat
            ws = None
            if not lazy or tr.failcnt is None or usage >= LAZY_MEM_FRACTION * limit:
                tr.failcnt = int(pread(fds[3], 64, 0))
                # Page cache counts in usage and fills any limit; inactive file pages are what
                # reclaim drops first, so they are not pressure. (~10 us: only near the limit.)
                ws = max(0, usage - _stat_value(pread(fds[5], 8192, 0), b"\ntotal_inactive_file "))
            if not lazy or tr.oom is None or tr.oom[0] or usage >= OOM_CHECK_FRACTION * limit:
                oom = pread(fds[4], 4096, 0).split()
                if oom[2] != b"under_oom":
                    raise RuntimeFailure(f"unexpected memory.oom_control layout in {path}", path=path)
                tr.oom = (oom[3] != b"0", int(oom[5]) if len(oom) > 5 else 0)
            psi = [parse_psi_some_total(pread(fd, 4096, 0)) for fd in fds[6:]] if len(fds) > 6 else None
        except OSError:
            self.forget(path)  # gone (ENODEV/ENOENT): drop descriptors, let the caller decide
            raise
        tr.last_t, tr.last_cpu_ns = t, cpu_ns
        stat = tr.stat
        oom = tr.oom
        # Positional: keyword construction of a 15-field dataclass costs ~2x (this runs 1280x/s).
        return CgroupSample(
            t, cpu_ns, stat[0], stat[1], stat[2], usage, limit, tr.failcnt, 0, 0, oom[1], oom[0],
            psi[0] if psi else None, psi[1] if psi else None, quota, ws,
        )

    def oom_kills(self, path: str) -> int:
        """The cgroup's OOM-kill count, read now (sample() refreshes it only near the limit)."""
        return oom_kill_count(read_text(self.dir("memory", path) / "memory.oom_control"))


def _stat_value(data: bytes, key: bytes) -> int:
    """One `key value` line of memory.stat (key given with its leading newline); 0 if absent."""
    i = data.find(key)
    if i < 0:
        return 0
    j = i + len(key)
    return int(data[j : data.index(b"\n", j)])


class _Track:
    """Per-cgroup sampling state: cached descriptors and the last values of lazily read files.

    Lazy reads (each counter is cumulative, so a skipped read loses nothing: the next read sees
    the whole delta):
    - cpu.stat is read when the CPU used since the last sample is >= LAZY_CPU_FRACTION of the
      quota, or the last read showed new throttling, or the quota just changed. A throttled 100 ms
      period uses the full quota for that period, so any 200 ms window containing one is at
      >= 25% of quota (>= 50% if it contains the whole period).
    - memory.failcnt only grows while usage sits at the limit: read when usage >= 50% of it,
      together with memory.stat (for the working set: usage minus inactive file cache).
    - memory.oom_control (under_oom, oom_kill) only changes at the limit: read when usage >= 90%
      of it, while it last said under_oom, and after a limit change.
    Values rollstack wrote (cfs quota, memory limit) are remembered, not re-read.
    """

    __slots__ = ("fds", "cpu_limit", "mem_limit", "last_t", "last_cpu_ns", "stat", "force_stat", "failcnt", "oom")

    def __init__(self, fds: FdCache) -> None:
        self.fds = fds
        self.cpu_limit: float | None = None
        self.mem_limit = UNLIMITED_V1
        self.last_t: float | None = None
        self.last_cpu_ns = 0
        self.stat: tuple[int, int, int] | None = None
        self.force_stat = False
        self.failcnt: int | None = None
        self.oom: tuple[bool, int] | None = None


def _rel(path: str) -> str:
    """A cgroup path relative to a hierarchy root; refuses empty paths and `..`."""
    rel = str(path).strip("/")
    if not rel or ".." in rel.split("/"):
        raise InvalidRequest(f"bad cgroup path {path!r}", path=str(path))
    return rel


__all__ = ["CgroupV1", "UNLIMITED_V1", "CONTROLLERS"]
