"""`CgroupV2`: the unified hierarchy (most production hosts).

File names and formats follow the kernel's cgroup-v2 documentation: `cpu.max` ("$MAX $PERIOD"),
`cpu.stat` (usage_usec, nr_periods, nr_throttled, throttled_usec), `memory.current`,
`memory.max` / `memory.high` ("max" or bytes), `memory.events` (low/high/max/oom/oom_kill),
`memory.pressure` / `cpu.pressure` (PSI; rollstack uses the `some total=` microsecond counter,
because the avg10 averages only refresh every 2 s), `pids.max`.

v2 cannot pause a task at its limit the way v1's oom_kill_disable does, so the elastic quota is
applied as `memory.high` (reclaim + throttle above it) with `memory.max` at the environment's cap
(the kernel OOM-kills only there). `under_oom` is reported when usage has reached the quota.

This host's v2 mount has no cpu/memory controllers, so this backend is tested against a fake
cgroupfs tree with the kernel's file formats (tests/unit/provision/test_provision_cgroup_v2.py).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from rollstack.errors import InvalidRequest, RuntimeFailure
from rollstack.host.cgroups import oom_kill_count
from rollstack.provision._files import FdCache, parse_flat_keyed, parse_psi_some_total, read_text, write_text
from rollstack.provision.backend import CFS_PERIOD_US, CgroupBackend
from rollstack.provision.sample import CgroupSample

UNDER_OOM_SLACK = 256 * 1024
"""Usage within this many bytes of the quota counts as "at the limit" (v2 has no under_oom flag)."""

CONTROLLERS = ("cpu", "memory", "pids")


class CgroupV2(CgroupBackend):
    """Elastic control through v2 files under one unified `root`."""

    version = 2

    def __init__(self, root: Path = Path("/sys/fs/cgroup")) -> None:
        self.root = Path(root)
        self._cache: dict[str, FdCache] = {}

    def dir(self, path: str) -> Path:
        rel = str(path).strip("/")
        if not rel or ".." in rel.split("/"):
            raise InvalidRequest(f"bad cgroup path {path!r}", path=str(path))
        return self.root / rel

    def _dirs(self, path: str) -> list[Path]:
        d = self.dir(path)
        return [d] if d.exists() else []

    # -- lifecycle -----------------------------------------------------------------------------
    def create(self, path: str) -> None:
        d = self.dir(path)
        # Controllers must be enabled in every ancestor's subtree_control for the leaf to get files.
        parent = self.root
        for part in d.relative_to(self.root).parts:
            self._enable_controllers(parent)
            parent = parent / part
            self._mkdir(parent)

    def _mkdir(self, d: Path) -> None:
        """mkdir on cgroupfs (the kernel populates the interface files; a test fake overrides this)."""
        d.mkdir(exist_ok=True)

    def _enable_controllers(self, d: Path) -> None:
        ctl = d / "cgroup.subtree_control"
        enabled = set(read_text(ctl).split())
        missing = [c for c in CONTROLLERS if c not in enabled]
        if missing:
            try:
                write_text(ctl, " ".join("+" + c for c in missing))
            except OSError as exc:
                raise RuntimeFailure(f"cannot enable {missing} in {d}: {exc}", path=str(d)) from exc

    def exists(self, path: str) -> bool:
        return self.dir(path).is_dir()

    def procs(self, path: str) -> list[int]:
        try:
            return sorted(int(x) for x in read_text(self.dir(path) / "cgroup.procs").split())
        except FileNotFoundError:
            return []

    def add_proc(self, path: str, pid: int) -> None:
        write_text(self.dir(path) / "cgroup.procs", str(pid))

    def oom_kills(self, path: str) -> int:
        return oom_kill_count(read_text(self.dir(path) / "memory.events"))

    def forget(self, path: str) -> None:
        entry = self._cache.pop(path, None)
        if entry:
            entry.close()

    # -- limits --------------------------------------------------------------------------------
    def set_cpu(self, path: str, cores: float | None) -> None:
        quota = "max" if cores is None else str(max(1000, int(round(cores * CFS_PERIOD_US))))
        write_text(self.dir(path) / "cpu.max", f"{quota} {CFS_PERIOD_US}")

    def set_cpu_weight(self, path: str, weight: int) -> None:
        write_text(self.dir(path) / "cpu.weight", str(max(1, min(10000, int(weight)))))

    def set_memory(self, path: str, limit_bytes: int, high: int | None = None) -> int:
        d = self.dir(path)
        # Order matters for the kernel only in that high > max is pointless; write high first when
        # shrinking so the cgroup is reclaimed gently before the hard limit moves.
        write_text(d / "memory.high", "max" if high is None else str(int(high)))
        write_text(d / "memory.max", str(int(limit_bytes)))
        return int(limit_bytes) if high is None else int(high)

    def set_memory_quota(self, path: str, quota: int, cap: int) -> int:
        return self.set_memory(path, max(int(cap), int(quota)), high=int(quota))

    def kill(self, path: str, timeout: float = 5.0) -> bool:
        """`cgroup.kill` (Linux 5.14+) kills every task atomically, forks included; then verify."""
        ctl = self.dir(path) / "cgroup.kill"
        if ctl.exists():
            try:
                self._unlimit_memory(path)
                write_text(ctl, "1")
            except OSError:
                pass
        return super().kill(path, timeout)

    def _unlimit_memory(self, path: str) -> None:
        d = self.dir(path)
        write_text(d / "memory.high", "max")
        write_text(d / "memory.max", "max")

    def set_pids(self, path: str, max_pids: int | None) -> None:
        write_text(self.dir(path) / "pids.max", "max" if max_pids is None else str(int(max_pids)))

    # -- sampling ------------------------------------------------------------------------------
    def sample(self, path: str, now: float | None = None) -> CgroupSample:
        cache = self._cache.get(path)
        if cache is None:
            d = self.dir(path)
            names = ("cpu.stat", "cpu.max", "memory.current", "memory.max", "memory.high", "memory.events",
                     "memory.stat")
            cache = self._cache[path] = FdCache(tuple(d / n for n in names))
        d = cache.paths[0].parent
        try:
            fds = cache.fds or cache.open()
            raw = [os.pread(fd, 4096, 0) for fd in fds[:6]]
            cpu = parse_flat_keyed(raw[0])
            cpu_max = raw[1].split()
            current = int(raw[2])
            mmax = _limit(raw[3])
            high = _limit(raw[4])
            events = parse_flat_keyed(raw[5])
            mem_psi = _optional_psi(cache, d / "memory.pressure")
            cpu_psi = _optional_psi(cache, d / "cpu.pressure")
        except OSError:
            self.forget(path)
            raise
        limit = high if high is not None else mmax
        limit_bytes = limit if limit is not None else 1 << 63
        ws = None
        if current >= limit_bytes // 2:  # cache only matters near the limit (see CgroupV1)
            try:
                stat = b"\n" + os.pread(fds[6], 16384, 0)
            except OSError:
                self.forget(path)
                raise
            i = stat.find(b"\ninactive_file ")
            if i >= 0:
                ws = max(0, current - int(stat[i + 15 : stat.index(b"\n", i + 15)]))
        quota = cpu_max[0]
        return CgroupSample(
            t=time.monotonic() if now is None else now,
            cpu_usage_ns=cpu.get(b"usage_usec", 0) * 1000,
            nr_periods=cpu.get(b"nr_periods", 0),
            nr_throttled=cpu.get(b"nr_throttled", 0),
            throttled_ns=cpu.get(b"throttled_usec", 0) * 1000,
            memory_usage=current,
            memory_limit=limit_bytes,
            events_high=events.get(b"high", 0),
            events_max=events.get(b"max", 0),
            oom_kill_count=events.get(b"oom_kill", 0),
            under_oom=current + UNDER_OOM_SLACK >= limit_bytes,
            pressure_total_us=mem_psi,
            cpu_pressure_total_us=cpu_psi,
            cpu_limit=None if quota == b"max" else int(quota) / int(cpu_max[1]),
            memory_working_set=ws,
        )


def _limit(raw: bytes) -> int | None:
    raw = raw.strip()
    return None if raw == b"max" else int(raw)


def _optional_psi(cache: FdCache, path: Path) -> int | None:
    try:
        return parse_psi_some_total(cache.read(path))
    except FileNotFoundError:  # kernels built without PSI, or psi=0
        return None
