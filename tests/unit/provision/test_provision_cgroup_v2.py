"""CgroupV2 against a fake cgroupfs tree (this host's v2 mount has no cpu/memory controllers).

The fake files use the kernel's formats (Documentation/admin-guide/cgroup-v2.rst); the test plays
the kernel by rewriting counter files between samples.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rollstack.errors import InvalidRequest, RuntimeFailure
from rollstack.provision import CgroupV1, CgroupV2, NodeCapacity, PolicyConfig, QuotaPolicy, detect_backend
from rollstack.provision.config import GiB, MiB

LEAF_FILES = {
    "cgroup.procs": "",
    "cpu.max": "max 100000\n",
    "cpu.weight": "100\n",
    "cpu.stat": "usage_usec 0\nuser_usec 0\nsystem_usec 0\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n"
    "nr_bursts 0\nburst_usec 0\n",
    "memory.current": "0\n",
    "memory.max": "max\n",
    "memory.high": "max\n",
    "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
    "memory.pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
    "cpu.pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
    "pids.max": "max\n",
    "memory.stat": "anon 0\nfile 0\nkernel 0\nshmem 0\nactive_anon 0\ninactive_anon 0\nactive_file 0\n"
    "inactive_file 0\nunevictable 0\n",
}


@pytest.fixture
def fake_root(tmp_path: Path) -> Path:
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    (root / "cgroup.subtree_control").write_text("")
    (root / "cgroup.procs").write_text("1\n")
    return root


class FakeKernelV2(CgroupV2):
    """CgroupV2 whose mkdir also does what the kernel does: populate the interface files."""

    def _mkdir(self, d: Path) -> None:
        if d.exists():
            return
        d.mkdir()
        for name, text in LEAF_FILES.items():
            (d / name).write_text(text)
        (d / "cgroup.subtree_control").write_text("")


def make_leaf(backend: CgroupV2, path: str) -> Path:
    backend.create(path)
    return backend.dir(path)


def test_detect_backend_picks_v2_v1_or_refuses(fake_root: Path, tmp_path: Path):
    assert isinstance(detect_backend(fake_root), CgroupV2)
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "cpu").mkdir()
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert isinstance(detect_backend(v1), CgroupV1)
    with pytest.raises(RuntimeFailure):
        detect_backend(tmp_path / "nothing")


def test_create_enables_controllers_in_every_ancestor(fake_root: Path):
    b = FakeKernelV2(fake_root)
    make_leaf(b, "rollstack/env1")
    assert set((fake_root / "cgroup.subtree_control").read_text().split()) == {"+cpu", "+memory", "+pids"}
    assert set((fake_root / "rollstack" / "cgroup.subtree_control").read_text().split()) == {"+cpu", "+memory", "+pids"}
    with pytest.raises(InvalidRequest):
        b.dir("../escape")


def test_writes_use_kernel_formats(fake_root: Path):
    b = FakeKernelV2(fake_root)
    d = make_leaf(b, "rollstack/e")
    b.set_cpu("rollstack/e", 0.5)
    assert (d / "cpu.max").read_text() == "50000 100000"
    b.set_cpu("rollstack/e", None)
    assert (d / "cpu.max").read_text() == "max 100000"
    b.set_cpu("rollstack/e", 0.001)  # kernel minimum is 1 ms per period
    assert (d / "cpu.max").read_text() == "1000 100000"
    assert b.set_memory_quota("rollstack/e", 256 * MiB, 2 * GiB) == 256 * MiB
    assert (d / "memory.high").read_text() == str(256 * MiB)
    assert (d / "memory.max").read_text() == str(2 * GiB)
    b.set_memory("rollstack/e", 512 * MiB)
    assert (d / "memory.high").read_text() == "max" and (d / "memory.max").read_text() == str(512 * MiB)
    b.set_cpu_weight("rollstack/e", 400)
    assert (d / "cpu.weight").read_text() == "400"
    b.set_pids("rollstack/e", 128)
    assert (d / "pids.max").read_text() == "128"
    b.set_pids("rollstack/e", None)
    assert (d / "pids.max").read_text() == "max"


def test_sample_parses_counters_and_follows_rewrites(fake_root: Path):
    b = FakeKernelV2(fake_root)
    d = make_leaf(b, "rollstack/e")
    (d / "cpu.max").write_text("25000 100000\n")
    (d / "memory.high").write_text(f"{64 * MiB}\n")
    (d / "memory.max").write_text(f"{GiB}\n")
    s0 = b.sample("rollstack/e", now=1.0)
    assert s0.cpu_limit == 0.25 and s0.memory_limit == 64 * MiB and s0.pressure_total_us == 0
    assert not s0.under_oom
    # the "kernel" moves on: 0.2 s later the cgroup used 50 ms CPU, was throttled in 2 of 2
    # periods, sits at its memory.high, and stalled 30 ms on memory
    (d / "cpu.stat").write_text(
        "usage_usec 50000\nuser_usec 40000\nsystem_usec 10000\nnr_periods 2\nnr_throttled 2\n"
        "throttled_usec 150000\nnr_bursts 0\nburst_usec 0\n"
    )
    (d / "memory.current").write_text(f"{64 * MiB - 4096}\n")
    (d / "memory.stat").write_text(
        f"anon {40 * MiB}\nfile {24 * MiB}\nactive_anon {40 * MiB}\ninactive_anon 0\nactive_file {16 * MiB}\n"
        f"inactive_file {8 * MiB}\nunevictable 0\n"
    )
    (d / "memory.events").write_text("low 0\nhigh 7\nmax 0\noom 0\noom_kill 1\noom_group_kill 0\n")
    (d / "memory.pressure").write_text(
        "some avg10=1.00 avg60=0.10 avg300=0.00 total=30000\nfull avg10=0.50 avg60=0.00 avg300=0.00 total=12000\n"
    )
    s1 = b.sample("rollstack/e", now=1.2)
    assert (s1.cpu_usage_ns, s1.nr_periods, s1.nr_throttled, s1.throttled_ns) == (50_000_000, 2, 2, 150_000_000)
    assert (s1.events_high, s1.events_max, s1.oom_kill_count) == (7, 0, 1)
    assert s1.under_oom and s1.pressure_total_us == 30000 and s1.memory_usage == 64 * MiB - 4096
    assert s1.memory_working_set == 56 * MiB - 4096  # minus inactive_file
    assert s0.memory_working_set is None  # far below the limit: memory.stat not read
    assert b.oom_kills("rollstack/e") == 1
    # the same policy runs on v2 samples: severe CPU and memory pressure -> x4 each
    p = QuotaPolicy(PolicyConfig(), NodeCapacity(cpu=2, memory=8 * GiB))
    st = p.new_state("e", 0.25, 64 * MiB, None, None, 0.0)
    st = p.decide(st, s0, p.node(0.25, 64 * MiB)).state
    d1 = p.decide(st, s1, p.node(0.25, 64 * MiB))
    assert d1.new_cpu == 1.0 and d1.new_memory == 256 * MiB
    assert any(e["signal"] == "oom_kill" for e in d1.events)


def test_unlimited_memory_and_missing_psi(fake_root: Path):
    b = FakeKernelV2(fake_root)
    d = make_leaf(b, "rollstack/e")
    (d / "memory.pressure").unlink()
    (d / "cpu.pressure").unlink()
    s = b.sample("rollstack/e", now=0.0)
    assert s.memory_limit == 1 << 63 and s.cpu_limit is None
    assert s.pressure_total_us is None and s.cpu_pressure_total_us is None and not s.under_oom


def test_sample_of_a_vanished_cgroup_raises_and_forgets(fake_root: Path):
    b = FakeKernelV2(fake_root)
    d = make_leaf(b, "rollstack/e")
    b.sample("rollstack/e")
    for f in d.iterdir():
        f.unlink()
    d.rmdir()
    b.forget("rollstack/e")
    with pytest.raises(OSError):
        b.sample("rollstack/e")
    assert b.procs("rollstack/e") == [] and not b.exists("rollstack/e")


def test_procs_and_remove_of_missing_cgroup(fake_root: Path):
    b = FakeKernelV2(fake_root)
    d = make_leaf(b, "rollstack/e")
    (d / "cgroup.procs").write_text("")
    assert b.procs("rollstack/e") == []
    b.remove("rollstack/missing")  # nothing to do, no error


def test_fd_cache_closes_each_descriptor_once(tmp_path: Path, monkeypatch):
    """`FdCache.close` takes the descriptors out before closing them: a second close (a
    `forget` after a failed sample's) closes nothing, and an EBADF is raised, not hidden."""
    import errno
    import os

    from rollstack.provision._files import FdCache

    files = [tmp_path / n for n in ("a", "b", "c")]
    for f in files:
        f.write_text("1\n")
    cache = FdCache(tuple(files[:2]))
    assert cache.read_all() == [b"1\n", b"1\n"]
    assert cache.read(files[2]) == b"1\n"
    fds = list(cache.fds or []) + [*cache._extra.values()]
    closed: list[int] = []
    real_close = os.close
    monkeypatch.setattr(os, "close", lambda n: (closed.append(n), real_close(n))[1])
    cache.close()
    cache.close()
    assert sorted(closed) == sorted(fds)
    closed.clear()
    cache.read_all()
    real_close(cache.fds[0])  # closed behind the cache's back
    with pytest.raises(OSError) as exc:
        cache.close()
    assert exc.value.errno == errno.EBADF
    assert len(closed) == 2 and cache.fds is None  # the other one was still closed
    cache.close()
    assert len(closed) == 2
