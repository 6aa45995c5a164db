"""Property and example tests of the pure quota policy (no I/O)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rollstack.provision.config import GiB, MiB, NodeCapacity, PolicyConfig
from rollstack.provision.policy import _STATE_FIELDS, CPU_EPS, NodeView, QuotaPolicy, memory_floor
from rollstack.provision.sample import CgroupSample

CFG = PolicyConfig()
CAP = NodeCapacity(cpu=2, memory=24 * GiB)


def mk(t, cpu_ns=0, periods=0, throttled=0, usage=0, limit=64 * MiB, failcnt=0, under_oom=False, **kw):
    return CgroupSample(t=t, cpu_usage_ns=cpu_ns, nr_periods=periods, nr_throttled=throttled, throttled_ns=0,
                        memory_usage=usage, memory_limit=limit, failcnt=failcnt, under_oom=under_oom, **kw)  # fmt: skip


def fresh(policy, start_cpu=0.25, start_mem=64 * MiB, max_cpu=None, max_mem=None):
    s = policy.new_state("e", start_cpu, start_mem, max_cpu, max_mem, 0.0)
    d = policy.decide(s, mk(0.0, limit=s.memory), roomy(policy))
    return d.state


def roomy(policy):
    return policy.node(0.0, 0)


def node_for(policy, state, other_cpu=0.0, other_mem=0):
    return policy.node(other_cpu + state.cpu, other_mem + state.memory)


# -- examples --------------------------------------------------------------------------------------
def test_one_ordinary_cpu_sample_doubles_and_severe_quadruples():
    p = QuotaPolicy(CFG, CAP)
    s = fresh(p)
    # 0.22 cores used of 0.25 (>= 80%), no throttling -> ordinary x2
    d = p.decide(s, mk(0.2, cpu_ns=int(0.22 * 0.2e9), periods=2), node_for(p, s))
    assert d.new_cpu == 0.5 and d.events[0]["signal"] == "cpu_usage_high"
    # every period throttled -> severe x4
    d = p.decide(s, mk(0.2, cpu_ns=int(0.25 * 0.2e9), periods=2, throttled=2), node_for(p, s))
    assert d.new_cpu == 1.0 and "x4" in d.events[0]["reason"]
    # one throttled period of three -> ordinary x2
    d = p.decide(s, mk(0.2, cpu_ns=int(0.05 * 0.2e9), periods=3, throttled=1), node_for(p, s))
    assert d.new_cpu == 0.5


def test_memory_grows_x2_ordinary_x4_severe_and_independently_of_cpu():
    p = QuotaPolicy(CFG, CAP)
    s = fresh(p)
    d = p.decide(s, mk(0.2, usage=int(0.85 * 64 * MiB)), node_for(p, s))
    assert d.new_memory == 128 * MiB and d.new_cpu == s.cpu
    d = p.decide(s, mk(0.2, usage=64 * MiB, under_oom=True), node_for(p, s))
    assert d.new_memory == 256 * MiB
    d = p.decide(s, mk(0.2, usage=40 * MiB, failcnt=3), node_for(p, s))
    assert d.new_memory == 128 * MiB and d.events[0]["signal"] == "mem_failcnt"
    d = p.decide(s, mk(0.2, usage=10 * MiB, failcnt=3), node_for(p, s))  # limit hit, then freed
    assert d.new_memory == 64 * MiB


def test_page_cache_is_not_pressure_but_a_working_set_is():
    p = QuotaPolicy(CFG, CAP)
    s = fresh(p)
    # usage at 98% of the limit, but 90% of it inactive file cache; failcnt grows as cache is dropped
    d = p.decide(s, mk(0.2, usage=int(0.98 * 64 * MiB), failcnt=50, memory_working_set=4 * MiB), node_for(p, s))
    assert d.new_memory == 64 * MiB and d.events == []
    d = p.decide(s, mk(0.2, usage=int(0.98 * 64 * MiB), failcnt=50, memory_working_set=40 * MiB), node_for(p, s))
    assert d.new_memory == 128 * MiB and d.events[0]["signal"] == "mem_failcnt"
    d = p.decide(s, mk(0.2, usage=int(0.98 * 64 * MiB), memory_working_set=62 * MiB), node_for(p, s))
    assert d.new_memory == 256 * MiB and d.events[0]["signal"] == "mem_usage_severe"
    # a task paused under OOM is severe whatever the working set says
    d = p.decide(s, mk(0.2, usage=64 * MiB, under_oom=True, memory_working_set=1 * MiB), node_for(p, s))
    assert d.new_memory == 256 * MiB


def test_v2_signals_events_and_psi_count_as_pressure():
    p = QuotaPolicy(CFG, CAP)
    s = fresh(p)
    s = p.decide(s, mk(0.1, usage=MiB, pressure_total_us=1000), node_for(p, s)).state
    d = p.decide(s, mk(0.3, usage=MiB, pressure_total_us=1000 + 50_000), node_for(p, s))
    assert d.new_memory == 128 * MiB and d.events[0]["signal"] == "mem_psi"
    d = p.decide(s, mk(0.3, usage=40 * MiB, events_high=2), node_for(p, s))
    assert d.new_memory == 128 * MiB and d.events[0]["signal"] == "mem_events"


def test_grow_is_capped_by_env_cap_and_node_cores():
    p = QuotaPolicy(CFG, CAP)
    s = fresh(p, start_cpu=1.0, max_cpu=64)  # 64-core default clamps to the node's 2 cores
    assert s.max_cpu == 2
    d = p.decide(s, mk(0.2, cpu_ns=int(0.2e9), periods=2, throttled=2), node_for(p, s))
    assert d.new_cpu == 2.0
    s2 = d.state
    d = p.decide(s2, mk(0.4, cpu_ns=int(0.6e9), periods=4, throttled=4), node_for(p, s2))
    assert d.new_cpu == 2.0 and "at cap" in d.events[0]["reason"]
    # a persisting denial is logged once, not every sample
    d2 = p.decide(d.state, mk(0.6, cpu_ns=int(1.0e9), periods=6, throttled=6), node_for(p, d.state))
    assert d2.events == []


def test_scale_up_may_not_eat_the_reserve_but_admission_may():
    cfg = PolicyConfig(cpu_overcommit=1.0)
    p = QuotaPolicy(cfg, NodeCapacity(cpu=2, memory=10 * GiB))
    s = fresh(p, start_mem=1 * GiB)
    # others hold 7 GiB: 8 GiB committed, 2 GiB reserve -> no room to grow at all
    node = node_for(p, s, other_mem=7 * GiB)
    d = p.decide(s, mk(0.2, usage=GiB, under_oom=True, limit=GiB), node)
    assert d.new_memory == GiB and d.short_memory == 3 * GiB and "reserve" in d.events[0]["reason"]
    assert node.admits(0.1, 2 * GiB)  # admission may use the reserve
    assert not node.admits(0.1, 2 * GiB + 4096)
    # others hold 6 GiB: a x4 grow is capped at the 8 GiB line
    node = node_for(p, s, other_mem=6 * GiB)
    d = p.decide(s, mk(0.2, usage=GiB, under_oom=True, limit=GiB), node)
    assert d.new_memory == 2 * GiB and d.short_memory == 2 * GiB and "capped" in d.events[0]["reason"]


def test_shrink_waits_for_sustained_low_usage_steps_by_half_and_stops_at_start():
    cfg = PolicyConfig(shrink_after_s=10)
    p = QuotaPolicy(cfg, CAP)
    s = fresh(p, start_cpu=0.25)
    s = p.decide(s, mk(0.2, cpu_ns=int(0.05e9), periods=2, throttled=2), node_for(p, s)).state
    assert s.cpu == 1.0
    t, ns, cpus = 0.2, int(0.05e9), []
    while t < 60:
        t += 0.2
        d = p.decide(s, mk(t, cpu_ns=ns, periods=2, throttled=2), node_for(p, s))
        s = d.state
        cpus.append((round(t, 1), s.cpu))
    changes = [(t, c) for (t, c), (_, prev) in zip(cpus[1:], cpus) if c != prev]
    assert [c for _, c in changes] == [0.5, 0.25]
    assert changes[0][0] >= 10.2 and changes[1][0] - changes[0][0] >= 10


def test_memory_shrink_keeps_usage_plus_headroom():
    cfg = PolicyConfig(shrink_after_s=1)
    p = QuotaPolicy(cfg, CAP)
    s = fresh(p, start_mem=40 * MiB)
    s = p.decide(s, mk(0.2, usage=40 * MiB, limit=40 * MiB, under_oom=True), node_for(p, s)).state
    assert s.memory == 160 * MiB
    t, seen = 0.2, []
    while t < 30:
        t += 0.2
        s = p.decide(s, mk(t, usage=30 * MiB, limit=s.memory), node_for(p, s)).state
        seen.append(s.memory)
    # 160 -> max(start 40, 160/2, 30 + 64 MiB headroom) = 94 MiB; then 30 MiB is no longer < 25%
    assert sorted(set(seen), reverse=True) == [160 * MiB, 94 * MiB]
    assert memory_floor(cfg, 30 * MiB) == 94 * MiB


def test_oom_terminates_only_after_n_consecutive_samples_at_cap():
    cfg = PolicyConfig(oom_terminate_samples=10)
    p = QuotaPolicy(cfg, CAP)
    s = fresh(p, start_mem=64 * MiB, max_mem=128 * MiB)
    t = 0.0
    results = []
    for i in range(25):
        t += 0.2
        oom = i != 8  # one relieved sample in the middle resets the count
        d = p.decide(s, mk(t, usage=s.memory, limit=s.memory, under_oom=oom), node_for(p, s))
        s = d.state
        results.append(d.terminate is not None)
    # sample 0 grows 64->128 MiB (cap); samples 1..7 count 1..7; 8 resets; 9.. count 1..; the 11th
    # consecutive sample at cap (count 11 > 10) is index 19
    assert results.index(True) == 19
    d = [d for d in [p.decide(s, mk(t + 0.2, usage=s.memory, limit=s.memory, under_oom=True), node_for(p, s))]][0]
    assert d.terminate["code"] == "oom_terminated" and d.terminate["peak_memory"] == 128 * MiB


def test_oom_stalled_by_node_terminates_after_longer_window():
    cfg = PolicyConfig(oom_stall_terminate_samples=5, cpu_overcommit=1.0)
    p = QuotaPolicy(cfg, NodeCapacity(cpu=2, memory=1 * GiB))
    s = fresh(p, start_mem=64 * MiB)
    t, term = 0.0, None
    for i in range(20):
        t += 0.2
        d = p.decide(s, mk(t, usage=s.memory, limit=s.memory, under_oom=True), node_for(p, s, other_mem=800 * MiB))
        s = d.state
        if d.terminate:
            term = (i, d.terminate["cause"])
            break
    assert term == (5, "node_memory_exhausted")


def test_reclaim_takes_from_idle_envs_only_down_to_their_floors():
    cfg = PolicyConfig(cpu_overcommit=1.0)
    p = QuotaPolicy(cfg, NodeCapacity(cpu=4, memory=8 * GiB))
    idle = fresh(p, start_cpu=0.25, start_mem=64 * MiB)
    idle = p.decide(idle, mk(0.2, usage=64 * MiB, under_oom=True, cpu_ns=int(0.05e9), periods=2, throttled=2),
                    roomy(p)).state  # fmt: skip
    idle = p.decide(idle, mk(0.4, usage=250 * MiB, limit=256 * MiB, cpu_ns=int(0.4e9), periods=4, throttled=4),
                    roomy(p)).state  # fmt: skip
    assert idle.cpu == 4.0 and idle.memory == GiB
    idle = p.decide(idle, mk(0.6, usage=100 * MiB, limit=GiB, cpu_ns=int(0.41e9), periods=4, throttled=4),
                    roomy(p)).state  # fmt: skip
    assert idle.cpu_low_since is not None and idle.mem_low_since is not None
    busy = p.decide(fresh(p), mk(0.2, usage=0, cpu_ns=int(0.5e9)), roomy(p)).state
    plan = p.plan_reclaim([idle, busy], need_cpu=5.0, need_memory=4 * GiB, exclude="x")
    by = {e["resource"]: e for e in plan}
    assert by["cpu"]["new"] >= max(0.25, 2 * idle.cpu_usage) - CPU_EPS
    assert by["memory"]["new"] == max(64 * MiB, memory_floor(cfg, 100 * MiB))
    assert all(e["env"] == "e" for e in plan) and len(plan) == 2
    # a small need takes only what is needed
    plan = p.plan_reclaim([idle], need_cpu=0.5, need_memory=0, exclude="x")
    assert plan[0]["new"] == 3.5


# -- properties ------------------------------------------------------------------------------------
steps = st.lists(
    st.tuples(
        st.floats(0.05, 12.0),  # dt
        st.floats(0.0, 3.0),  # cpu demand in cores
        st.floats(0.0, 1.0),  # memory usage as a fraction of the limit in force
        st.booleans(),  # under_oom
        st.integers(0, 3),  # failcnt increment
        st.floats(0.0, 1.0),  # others' committed share of capacity
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(
    steps=steps,
    start_cpu=st.floats(0.01, 4.0),
    start_mem=st.integers(8 * MiB, 4 * GiB),
    max_cpu=st.one_of(st.none(), st.floats(0.01, 100.0)),
    max_mem=st.one_of(st.none(), st.integers(8 * MiB, 64 * GiB)),
    reserve=st.floats(0.0, 0.5),
)
def test_policy_invariants(steps, start_cpu, start_mem, max_cpu, max_mem, reserve):
    cfg = PolicyConfig(shrink_after_s=2.0, reserve_cpu_fraction=reserve, reserve_memory_fraction=reserve,
                       oom_terminate_samples=3)  # fmt: skip
    cap = NodeCapacity(cpu=2, memory=8 * GiB)
    p = QuotaPolicy(cfg, cap)
    s = p.new_state("e", start_cpu, start_mem, max_cpu, max_mem, 0.0)
    assert s.cpu <= s.max_cpu <= 2 and s.memory <= s.max_memory <= 8 * GiB
    t, ns, periods, throttled, failcnt = 0.0, 0, 0, 0, 0
    s = p.decide(s, mk(t, limit=s.memory), p.node(s.cpu, s.memory)).state
    at_cap_run = 0
    for dt, demand, mfrac, oom, finc, others in steps:
        t += dt
        used = min(demand, s.cpu)
        ns += int(used * dt * 1e9)
        n = max(1, int(dt / 0.1))
        periods += n
        if demand > s.cpu:
            throttled += n
        failcnt += finc
        usage = int(mfrac * s.memory)
        other_cpu = others * cap.cpu * cfg.cpu_overcommit
        other_mem = int(others * cap.memory)
        node = p.node(other_cpu + s.cpu, other_mem + s.memory)
        sample = mk(t, cpu_ns=ns, periods=periods, throttled=throttled, usage=usage, limit=s.memory,
                    failcnt=failcnt, under_oom=oom)  # fmt: skip
        old = s
        before = tuple(getattr(old, f) for f in _STATE_FIELDS)
        d = p.decide(s, sample, node)
        s = d.state
        assert tuple(getattr(old, f) for f in _STATE_FIELDS) == before and s is not old  # pure
        assert (d.new_cpu, d.new_memory) == (s.cpu, s.memory)
        # caps
        assert s.cpu <= s.max_cpu + CPU_EPS and s.memory <= s.max_memory
        # scale-ups never eat the reserve
        if s.cpu > old.cpu:
            assert node.committed_cpu + (s.cpu - old.cpu) <= node.cpu_capacity - node.reserve_cpu + 1e-6
        if s.memory > old.memory:
            assert node.committed_memory + (s.memory - old.memory) <= node.memory_capacity - node.reserve_memory
        # growth is at most x4 per sample
        assert s.cpu <= old.cpu * cfg.grow_severe + CPU_EPS and s.memory <= old.memory * cfg.grow_severe + 4096
        # shrinks stay above start and (memory) above usage + headroom
        if s.cpu < old.cpu:
            assert s.cpu >= s.start_cpu - CPU_EPS
        if s.memory < old.memory:
            assert s.memory >= s.start_memory and s.memory >= memory_floor(cfg, usage)
        # termination only after more than N consecutive under-OOM samples at the cap
        at_cap_run = at_cap_run + 1 if (oom and old.memory >= s.max_memory) else 0
        if d.terminate is not None and d.terminate["cause"] == "oom_at_cap":
            assert at_cap_run > cfg.oom_terminate_samples
        for ev in d.events:
            assert set(ev) == {"t", "env", "signal", "resource", "old", "new", "reason"}


@settings(max_examples=200, deadline=None)
@given(
    committed_cpu=st.floats(0, 20),
    committed_mem=st.integers(0, 16 * GiB),
    cpu=st.floats(0.01, 8),
    mem=st.integers(1, 8 * GiB),
)
def test_admission_is_capacity_minus_committed_including_the_reserve(committed_cpu, committed_mem, cpu, mem):
    cfg = PolicyConfig()
    cap = NodeCapacity(cpu=2, memory=8 * GiB)
    node = NodeView.of(cap, cfg, committed_cpu, committed_mem)
    expected = committed_cpu + cpu <= 2 * cfg.cpu_overcommit + 1e-6 and committed_mem + mem <= 8 * GiB
    assert node.admits(cpu, mem) == expected
    assert node.grow_budget_memory() == max(0, 8 * GiB - int(8 * GiB * 0.2) - committed_mem)


@settings(max_examples=200, deadline=None)
@given(
    envs=st.lists(
        st.tuples(st.floats(0.05, 1.0), st.floats(0.05, 2.0), st.integers(16, 512), st.integers(16, 1024),
                  st.floats(0.0, 1.0), st.floats(0.0, 1.0)),
        min_size=1, max_size=8,
    ),
    need_cpu=st.floats(0, 8),
    need_mem=st.integers(0, 4 * GiB),
)
def test_reclaim_respects_floors_and_takes_no_more_than_needed(envs, need_cpu, need_mem):
    cfg = PolicyConfig()
    p = QuotaPolicy(cfg, NodeCapacity(cpu=4, memory=8 * GiB))
    states = []
    for i, (start_cpu, cpu, start_mib, mib, cpu_use, mem_use) in enumerate(envs):
        s = p.new_state(f"e{i}", start_cpu, start_mib * MiB, None, None, 0.0)
        cur = max(cpu, s.start_cpu)
        mem = max(mib * MiB, s.start_memory)
        s = s.clone(cpu=cur, memory=mem, prev=mk(1.0), cpu_usage=cpu_use * cur * 0.3,
                    memory_usage=int(mem_use * mem * 0.3), cpu_low_since=0.5, mem_low_since=0.5)  # fmt: skip
        states.append(s)
    plan = p.plan_reclaim(states, need_cpu, need_mem, exclude="other")
    by_env = {s.env: s for s in states}
    freed = {"cpu": 0.0, "memory": 0}
    for ev in plan:
        s = by_env[ev["env"]]
        assert ev["new"] < ev["old"]
        if ev["resource"] == "cpu":
            assert ev["new"] >= max(s.start_cpu, 2 * s.cpu_usage) - CPU_EPS
        else:
            assert ev["new"] >= max(s.start_memory, memory_floor(cfg, s.memory_usage))
        freed[ev["resource"]] += ev["old"] - ev["new"]
    assert freed["cpu"] <= need_cpu + CPU_EPS
    assert freed["memory"] <= need_mem + 4096 * len(plan)
    assert len({(e["env"], e["resource"]) for e in plan}) == len(plan)
