"""Real cgroups (v1 on this host): backends, the Provisioner loop and real bursty processes.

Every test works under a unique `rollstack-test-<id>` parent and removes it (killing what is
inside) even on failure.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest

from components import need, require_root
from rollstack.provision import NodeCapacity, PolicyConfig, Provisioner, detect_backend
from rollstack.provision.config import GiB, MiB
from rollstack_bench.workload import WorkloadProcess

pytestmark = pytest.mark.integration


def _backend_or_skip():
    require_root()
    b = detect_backend()
    need(b.version == 1 or (b.root / "cgroup.controllers").read_text().split(), "cgroup v2 controllers")
    return b


@pytest.fixture
def cg():
    b = _backend_or_skip()
    parent = f"rollstack-test-{uuid.uuid4().hex[:8]}"
    made: list[str] = []
    procs: list[WorkloadProcess] = []

    class Ctx:
        backend = b

        def path(self, name: str) -> str:
            p = f"{parent}/{name}"
            b.create(p)
            made.append(p)
            return p

        def run(self, path: str, steps: list) -> WorkloadProcess:
            w = WorkloadProcess(b, path, steps)
            procs.append(w)
            return w

    try:
        yield Ctx()
    finally:
        for w in procs:
            w.kill()
        for p in made:
            b.remove(p)
        b.remove(parent)


def wait_for(pred, timeout: float, step: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


def test_backend_limits_and_sample_roundtrip(cg):
    b = cg.backend
    p = cg.path("rt")
    b.set_cpu(p, 0.5)
    assert b.set_memory(p, 96 * MiB) == 96 * MiB
    b.set_pids(p, 64)
    s = b.sample(p)
    assert s.cpu_limit == 0.5 and s.memory_limit == 96 * MiB and not s.under_oom
    if b.version == 1:
        assert (b.dir("memory", p) / "memory.oom_control").read_text().startswith("oom_kill_disable 1")
        assert (b.dir("cpu", p) / "cpu.cfs_quota_us").read_text().strip() == "50000"
    b.set_cpu(p, 0.1)
    w = cg.run(p, [{"burn": 0.15, "procs": 2}])
    assert w.wait(30) == 0
    s2 = b.sample(p)
    assert s2.cpu_limit == 0.1
    assert s2.cpu_usage_ns - s.cpu_usage_ns >= 0.28e9  # the burners' CPU was charged here
    assert s2.nr_throttled > 0  # two busy processes at 0.1 cores cannot avoid throttling


def test_lazy_v1_sampling_sees_what_eager_sampling_sees(cg):
    b = cg.backend
    if b.version != 1:
        pytest.skip("lazy reads are a v1 backend feature")
    from rollstack.provision import CgroupV1

    eager = CgroupV1(b.root, lazy=False)
    p = cg.path("lazy")
    b.set_cpu(p, 0.1)
    b.set_memory(p, 256 * MiB)
    lazy_s, eager_s = b.sample(p), eager.sample(p)
    w = cg.run(p, [{"alloc": 150}, {"burn": 0.1, "procs": 2}])
    busy_pairs = []
    while w.poll() is None:
        time.sleep(0.1)
        lazy_s, eager_s = b.sample(p), eager.sample(p)
        busy_pairs.append((lazy_s, eager_s))
    eager.forget(p)
    assert len(busy_pairs) >= 5
    for ls, es in busy_pairs:
        # the two reads are not atomic: eager (read second) may be one period ahead
        assert ls.nr_throttled <= es.nr_throttled <= ls.nr_throttled + 2
        assert ls.memory_limit == es.memory_limit == 256 * MiB and ls.cpu_limit == es.cpu_limit == 0.1
        assert ls.failcnt <= es.failcnt and ls.under_oom == es.under_oom
    assert busy_pairs[-1][0].nr_throttled > 0  # throttling was seen through the lazy path


def test_hybrid_host_psi_through_the_unified_tree(cg):
    from rollstack.provision import CgroupV1

    if cg.backend.version != 1:
        pytest.skip("a v1 backend feature (this host runs cgroup v2)")
    need((cg.backend.root / "unified" / "cgroup.procs").exists(), "the hybrid v2 mount next to the v1 controllers")
    b = CgroupV1(cg.backend.root, use_unified_psi=True)
    p = cg.path("psi")  # created by the fixture's backend; the PSI backend adds the unified dir
    b.create(p)
    b.set_cpu(p, 0.05)
    s0 = b.sample(p)
    assert s0.pressure_total_us is not None and s0.cpu_pressure_total_us is not None
    w = WorkloadProcess(b, p, [{"burn": 0.03, "procs": 2}])
    try:
        assert w.wait(30) == 0
    finally:
        w.kill()
    s1 = b.sample(p)
    assert s1.cpu_pressure_total_us > s0.cpu_pressure_total_us  # throttled tasks stall on CPU
    b.remove(p)
    assert not (b.root / "unified" / p).exists()


def test_lowering_memory_below_usage_keeps_old_limit(cg):
    b = cg.backend
    p = cg.path("ebusy")
    b.set_memory(p, 256 * MiB)
    w = cg.run(p, [{"alloc": 120}, {"sleep": 30}])
    assert wait_for(lambda: b.sample(p).memory_usage >= 120 * MiB, 15)
    applied = b.set_memory(p, 32 * MiB)  # anonymous memory, no swap: the kernel cannot reclaim it
    assert applied == 256 * MiB
    assert w.poll() is None  # not killed
    b.remove(p)  # kills the sleeper, removes the cgroup
    assert not b.exists(p)


def test_raising_memory_above_a_pinned_memsw_limit_works(cg):
    b = cg.backend
    if b.version != 1:
        pytest.skip("a v1 backend feature (this host runs cgroup v2)")
    need((b.dir("memory", "x").parent / "memory.memsw.limit_in_bytes").exists(), "v1 memsw accounting (swapaccount=1)")
    p = cg.path("memsw")
    b.set_memory(p, 64 * MiB)
    (b.dir("memory", p) / "memory.memsw.limit_in_bytes").write_text(str(64 * MiB))
    assert b.set_memory(p, 256 * MiB) == 256 * MiB


def test_remove_kills_tasks_paused_under_oom(cg):
    b = cg.backend
    p = cg.path("paused")
    b.set_memory(p, 48 * MiB)
    w = cg.run(p, [{"alloc": 200}])
    assert wait_for(lambda: b.sample(p).under_oom, 15)
    time.sleep(0.3)
    assert w.poll() is None  # paused, not killed (oom_kill_disable)
    assert b.oom_kills(p) == 0
    b.remove(p)
    assert not b.exists(p) and w.wait(5) != 0


def test_cpu_burner_gets_more_cpu_within_a_few_samples(cg):
    b = cg.backend
    p = cg.path("burn")
    prov = Provisioner(b, PolicyConfig(), NodeCapacity(cpu=2, memory=4 * GiB))
    prov.register("burn", p, start_cpu=0.2, start_memory=64 * MiB)
    w = cg.run(p, [{"burn": 20, "procs": 2}])
    with prov:
        # every period is throttled at 0.2 cores: the first decided sample must grow it
        assert wait_for(lambda: prov.quotas("burn")["cpu"] >= 0.8, 3.0)
        ticks = prov.loop_cost()["ticks"]
    w.kill()
    grows = [e for e in prov.events("burn") if e["resource"] == "cpu" and e["new"] > e["old"]]
    assert grows[0]["old"] == 0.2 and grows[0]["new"] in (0.4, 0.8)  # x2 or x4 by throttled share
    assert ticks <= 5  # within a few 200 ms samples (the first one only sets the baseline)
    q = int((b.dir("cpu", p) / "cpu.cfs_quota_us").read_text()) if b.version == 1 else None
    assert q is None or q == int(prov.quotas("burn")["cpu"] * 100_000)
    h = prov.history("burn")
    assert set(h[-1]) == {"t", "cpu_limit", "memory_limit", "cpu_usage", "memory_usage"}
    assert max(r["cpu_usage"] for r in h) > 0.1
    assert prov.write_latency()["count"] >= 3


def test_memory_ramp_grows_limit_and_completes_without_oom_kill(cg):
    b = cg.backend
    p = cg.path("ramp")
    prov = Provisioner(b, PolicyConfig(), NodeCapacity(cpu=2, memory=4 * GiB))
    prov.register("ramp", p, start_cpu=0.5, start_memory=64 * MiB)
    w = cg.run(p, [{"alloc": 300, "rate": 600}, {"sleep": 0.5}])
    with prov:
        rc = w.wait(30)
    assert rc == 0
    assert b.oom_kills(p) == 0
    assert prov.quotas("ramp")["memory"] >= 300 * MiB
    assert prov.quotas("ramp")["peak_memory"] >= 290 * MiB
    mem_events = [e for e in prov.events("ramp") if e["resource"] == "memory"]
    assert mem_events and all(e["new"] > e["old"] for e in mem_events)


def test_page_cache_filling_the_limit_does_not_grow_memory(cg, tmp_path):
    b = cg.backend
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        for _ in range(160):
            f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # so the reader's cgroup pays
    p = cg.path("cache")
    prov = Provisioner(b, PolicyConfig(), NodeCapacity(cpu=2, memory=4 * GiB))
    prov.register("cache", p, start_cpu=1.0, start_memory=64 * MiB)
    w = cg.run(p, [{"read": str(big)}, {"sleep": 0.5}])
    with prov:
        assert w.wait(30) == 0
    s = b.sample(p)
    assert s.failcnt > 0  # the cache did hit the limit (the kernel dropped cache to make room)
    mem_grows = [e for e in prov.events("cache") if e["resource"] == "memory" and e["new"] > e["old"]]
    assert mem_grows == [] and prov.quotas("cache")["memory"] == 64 * MiB


def test_hog_above_its_cap_is_terminated_with_peak_and_history(cg):
    b = cg.backend
    p = cg.path("hog")
    got: list[tuple[str, dict]] = []
    done = threading.Event()

    def on_terminate(env_id, reason):
        got.append((env_id, reason))
        b.kill(p)
        done.set()

    cfg = PolicyConfig(oom_terminate_samples=5)
    prov = Provisioner(b, cfg, NodeCapacity(cpu=2, memory=4 * GiB), on_terminate=on_terminate)
    prov.register("hog", p, start_cpu=0.5, start_memory=64 * MiB, max_memory=160 * MiB)
    w = cg.run(p, [{"alloc": 600}])
    with prov:
        assert done.wait(15)
    assert w.wait(5) == -9
    env_id, reason = got[0]
    assert env_id == "hog" and reason["code"] == "oom_terminated" and reason["cause"] == "oom_at_cap"
    assert reason["max_memory"] == 160 * MiB and reason["peak_memory"] >= 150 * MiB
    assert reason["consecutive_samples"] > 5
    limits = [h["memory_limit"] for h in reason["quota_history"]]
    assert limits[0] == 64 * MiB and limits[-1] == 160 * MiB
    assert prov.quotas("hog")["status"] == "terminated"
    assert any("terminate" in e["reason"] for e in prov.events("hog"))


def test_idle_environment_shrinks_back_to_start(cg):
    b = cg.backend
    p = cg.path("idle")
    cfg = PolicyConfig(shrink_after_s=0.6)
    prov = Provisioner(b, cfg, NodeCapacity(cpu=2, memory=4 * GiB))
    prov.register("idle", p, start_cpu=0.2, start_memory=64 * MiB)
    w = cg.run(p, [{"burn": 0.4, "procs": 2}, {"alloc": 150, "rate": 600}, {"free": True}, {"sleep": 30}])
    with prov:
        assert wait_for(lambda: prov.quotas("idle")["cpu"] >= 0.8, 5)
        assert wait_for(lambda: prov.quotas("idle")["memory"] >= 150 * MiB, 10)
        # back to the start CPU; memory to max(start, usage + 64 MiB headroom) ~ 65 MiB
        assert wait_for(lambda: prov.quotas("idle")["cpu"] == 0.2 and prov.quotas("idle")["memory"] < 80 * MiB, 15)
    w.kill()
    shrinks = [e for e in prov.events("idle") if e["signal"] == "low_usage"]
    assert {e["resource"] for e in shrinks} == {"cpu", "memory"}
    assert all(e["new"] >= {"cpu": 0.2, "memory": 64 * MiB}[e["resource"]] for e in shrinks)
    assert b.sample(p).memory_limit == prov.quotas("idle")["memory"]


def test_reclaim_from_idle_env_lets_a_busy_one_grow(cg):
    b = cg.backend
    idle_p, busy_p = cg.path("victim"), cg.path("grower")
    # 1 GiB node, 20% reserve: scale-ups may raise committed memory to ~819 MiB only
    prov = Provisioner(b, PolicyConfig(), NodeCapacity(cpu=2, memory=1 * GiB))
    prov.register("victim", idle_p, start_cpu=0.5, start_memory=64 * MiB)
    prov.register("grower", busy_p, start_cpu=0.5, start_memory=64 * MiB)
    v = cg.run(idle_p, [{"alloc": 300, "rate": 600}, {"free": True}, {"sleep": 30}])
    with prov:
        assert wait_for(lambda: prov.quotas("victim")["memory"] >= 512 * MiB, 10)
        assert wait_for(lambda: b.sample(idle_p).memory_usage < 32 * MiB, 10)  # freed: now idle
        time.sleep(0.5)
        g = cg.run(busy_p, [{"alloc": 400, "rate": 600}, {"sleep": 0.3}])
        assert g.wait(30) == 0
        node = prov.committed()
    v.kill()
    assert b.oom_kills(busy_p) == 0
    reclaims = [e for e in prov.events("victim") if e["signal"] == "reclaim"]
    assert reclaims and reclaims[0]["resource"] == "memory" and reclaims[0]["new"] < reclaims[0]["old"]
    assert reclaims[-1]["new"] >= 64 * MiB  # never below the victim's start
    assert prov.quotas("grower")["memory"] >= 400 * MiB
    assert node["memory"] <= 1 * GiB - node["reserve_memory"]  # scale-ups never ate the reserve


def test_vanished_cgroup_is_reported_and_admission_counts_quotas(cg):
    b = cg.backend
    p = cg.path("gone")
    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry()
    prov = Provisioner(b, PolicyConfig(cpu_overcommit=1.0), NodeCapacity(cpu=2, memory=1 * GiB), registry=reg)
    prov.register("gone", p, start_cpu=0.5, start_memory=512 * MiB)
    assert prov.admit(1.5, 512 * MiB) and not prov.admit(1.6, 512 * MiB) and not prov.admit(0.1, 513 * MiB)
    prov.tick()
    text = generate_latest(reg).decode()
    assert 'rollstack_env_memory_limit_bytes{env="gone"}' in text and "rollstack_node_committed_cpu_cores 0.5" in text
    b.remove(p)
    prov.tick()
    assert prov.quotas("gone")["status"] == "gone"
    assert prov.events("gone")[-1]["signal"] == "cgroup_gone"
    assert prov.committed()["cpu"] == 0
    prov.unregister("gone")
    with pytest.raises(LookupError):
        prov.history("gone")
