"""The Provisioner loop against an in-memory backend: registration, admission, apply, reclaim,
termination, vanished cgroups, metrics. (Real cgroups: tests/integration/provision.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from rollstack.errors import EnvironmentNotFound, InsufficientCapacity, InvalidRequest, RuntimeFailure
from rollstack.provision import CgroupBackend, CgroupSample, NodeCapacity, PolicyConfig, Provisioner
from rollstack.provision.config import GiB, MiB


class FakeBackend(CgroupBackend):
    """Cgroups as dicts; the test plays the kernel by setting usage/counters before each tick."""

    version = 0
    root = Path("/nonexistent")

    def __init__(self) -> None:
        self.cg: dict[str, dict] = {}
        self.t = 100.0
        self.refuse_shrink_below: dict[str, int] = {}
        self.writes: list[tuple] = []

    def create(self, path):
        self.cg.setdefault(path, {"cpu": None, "mem": 1 << 62, "cpu_ns": 0, "periods": 0, "throttled": 0,
                                  "usage": 0, "failcnt": 0, "under_oom": False, "procs": [4242]})  # fmt: skip

    def exists(self, path):
        return path in self.cg

    def procs(self, path):
        return list(self.cg.get(path, {}).get("procs", []))

    def add_proc(self, path, pid):
        self.cg[path]["procs"].append(pid)

    def set_cpu(self, path, cores):
        self.writes.append(("cpu", path, cores))
        self.cg[path]["cpu"] = cores

    def set_cpu_weight(self, path, weight):
        pass

    def set_memory(self, path, limit_bytes, high=None):
        c = self.cg[path]
        if limit_bytes < self.refuse_shrink_below.get(path, 0):
            return c["mem"]  # what v1 does on EBUSY
        self.writes.append(("mem", path, limit_bytes))
        c["mem"] = limit_bytes
        return limit_bytes

    def set_memory_quota(self, path, quota, cap):
        return self.set_memory(path, quota)

    def set_pids(self, path, max_pids):
        pass

    def sample(self, path, now=None):
        if path not in self.cg:
            raise FileNotFoundError(path)
        c = self.cg[path]
        return CgroupSample(t=self.t, cpu_usage_ns=c["cpu_ns"], nr_periods=c["periods"], nr_throttled=c["throttled"],
                            throttled_ns=0, memory_usage=c["usage"], memory_limit=c["mem"], failcnt=c["failcnt"],
                            under_oom=c["under_oom"], cpu_limit=c["cpu"])  # fmt: skip

    def oom_kills(self, path):
        return 0

    def forget(self, path):
        pass

    def _dirs(self, path):
        return []

    def _unlimit_memory(self, path):
        pass

    def kill(self, path, timeout=5.0):
        self.cg[path]["procs"] = []
        return True

    # kernel simulation helpers
    def advance(self, dt=0.2):
        self.t += dt

    def busy(self, path, cores_used, throttled_all=True, dt=0.2):
        c = self.cg[path]
        c["cpu_ns"] += int(cores_used * dt * 1e9)
        c["periods"] += 2
        c["throttled"] += 2 if throttled_all else 0


def test_register_applies_start_quotas_and_checks_admission():
    b = FakeBackend()
    prov = Provisioner(b, PolicyConfig(cpu_overcommit=1.0), NodeCapacity(cpu=2, memory=1 * GiB))
    q = prov.register("a", "rollstack/a", 0.5, 256 * MiB, max_cpu=64, max_memory=None)
    assert q == {"cpu": 0.5, "memory": 256 * MiB, "max_cpu": 2.0, "max_memory": 1 * GiB}
    assert b.cg["rollstack/a"]["cpu"] == 0.5 and b.cg["rollstack/a"]["mem"] == 256 * MiB
    assert prov.admit(1.5, 768 * MiB) and not prov.admit(1.5, 768 * MiB + 1)
    with pytest.raises(InsufficientCapacity):
        prov.register("b", "rollstack/b", 1.6, 64 * MiB)
    with pytest.raises(InvalidRequest):
        prov.register("a", "rollstack/a2", 0.1, 64 * MiB)
    with pytest.raises(InvalidRequest):
        prov.register("c", "rollstack/c", 0, 64 * MiB)
    with pytest.raises(EnvironmentNotFound):
        prov.history("nope")
    prov.unregister("nope")  # no-op
    assert prov.committed()["environments"] == 1


def test_memory_held_outside_environments_counts_as_committed():
    """The fork store's tmpfs (held_memory) takes capacity from admissions while it holds pages;
    a probe that fails counts as nothing held instead of stopping admissions."""
    held = [0]

    def probe() -> int:
        if held[0] < 0:
            raise OSError("statvfs failed")
        return held[0]

    prov = Provisioner(FakeBackend(), PolicyConfig(cpu_overcommit=1.0), NodeCapacity(cpu=2, memory=1 * GiB),
                       held_memory=probe)
    prov.register("a", "rollstack/a", 0.5, 256 * MiB)
    assert prov.admit(0.5, 768 * MiB) and prov.free_memory() == 768 * MiB
    held[0] = 512 * MiB
    assert not prov.admit(0.5, 768 * MiB) and prov.admit(0.5, 256 * MiB)
    assert prov.free_memory() == 256 * MiB and prov.committed()["held_memory"] == 512 * MiB
    with pytest.raises(InsufficientCapacity):
        prov.register("b", "rollstack/b", 0.5, 512 * MiB)
    held[0] = -1
    assert prov.admit(0.5, 768 * MiB) and prov.committed()["held_memory"] == 0


def test_register_turns_cgroup_os_errors_into_runtime_failure():
    class Broken(FakeBackend):
        def create(self, path):
            raise PermissionError(13, "Permission denied", path)

    prov = Provisioner(Broken(), PolicyConfig(), NodeCapacity(cpu=2, memory=4 * GiB))
    with pytest.raises(RuntimeFailure):
        prov.register("a", "rollstack/a", 0.5, 64 * MiB)
    assert prov.committed()["environments"] == 0


def test_a_register_writing_its_cgroup_holds_its_admission_but_not_the_lock():
    import threading

    class Slow(FakeBackend):
        def __init__(self):
            super().__init__()
            self.entered, self.release = threading.Event(), threading.Event()

        def create(self, path):
            super().create(path)
            if path == "rollstack/a":
                self.entered.set()
                assert self.release.wait(10)

    b = Slow()
    prov = Provisioner(b, PolicyConfig(cpu_overcommit=1.0), NodeCapacity(cpu=2, memory=1 * GiB))
    t = threading.Thread(target=prov.register, args=("a", "rollstack/a", 1.5, 256 * MiB))
    t.start()
    try:
        assert b.entered.wait(10)  # "a" is writing its cgroup
        # meanwhile another register runs (the lock is free) and sees a's reservation
        with pytest.raises(InsufficientCapacity):
            prov.register("b", "rollstack/b", 1.0, 64 * MiB)
        assert prov.register("c", "rollstack/c", 0.5, 64 * MiB)["cpu"] == 0.5
        assert not prov.admit(0.1, 64 * MiB)  # 1.5 pending + 0.5 registered
        with pytest.raises(InvalidRequest):
            prov.register("a", "rollstack/a2", 0.1, 64 * MiB)  # already being registered
    finally:
        b.release.set()
        t.join(10)
    assert prov.committed()["environments"] == 2 and prov.committed()["cpu"] == pytest.approx(2.0)


def test_an_unregister_during_register_withdraws_it():
    """A destroy racing a create: the registration being written is never completed, its
    admission is given back and its cached descriptors forgotten."""
    import threading

    from rollstack.errors import EnvironmentGone

    class Slow(FakeBackend):
        def __init__(self):
            super().__init__()
            self.entered, self.release, self.forgotten = threading.Event(), threading.Event(), []

        def create(self, path):
            super().create(path)
            self.entered.set()
            assert self.release.wait(10)

        def forget(self, path):
            self.forgotten.append(path)

    b = Slow()
    prov = Provisioner(b, PolicyConfig(cpu_overcommit=1.0), NodeCapacity(cpu=2, memory=1 * GiB))
    out: dict = {}

    def register():
        try:
            prov.register("a", "rollstack/a", 1.5, 256 * MiB)
        except Exception as e:  # noqa: BLE001 - inspected below
            out["error"] = e

    t = threading.Thread(target=register)
    t.start()
    assert b.entered.wait(10)
    prov.unregister("a")
    b.release.set()
    t.join(10)
    assert isinstance(out.get("error"), EnvironmentGone)
    assert prov.env_ids() == [] and prov.committed()["cpu"] == 0 and b.forgotten == ["rollstack/a"]
    b.entered.clear()
    b.release.set()
    assert prov.register("a", "rollstack/a", 1.5, 256 * MiB)["cpu"] == 1.5  # the id is free again


def test_a_failed_cgroup_write_gives_its_reservation_back():
    class Broken(FakeBackend):
        def set_cpu(self, path, cores):
            raise OSError(5, "Input/output error", path)

    prov = Provisioner(Broken(), PolicyConfig(cpu_overcommit=1.0), NodeCapacity(cpu=2, memory=1 * GiB))
    for _ in range(3):
        with pytest.raises(RuntimeFailure):
            prov.register("a", "rollstack/a", 1.5, 64 * MiB)
    assert prov.admit(2.0, 1 * GiB) and prov.committed()["environments"] == 0


def test_register_over_usage_settles_on_usage_plus_headroom_not_unlimited():
    b = FakeBackend()
    b.create("rollstack/a")
    b.cg["rollstack/a"]["usage"] = 200 * MiB  # already running, no limit yet
    b.refuse_shrink_below["rollstack/a"] = 200 * MiB  # v1: EBUSY under usage
    prov = Provisioner(b, PolicyConfig(), NodeCapacity(cpu=2, memory=4 * GiB))
    q = prov.register("a", "rollstack/a", 0.5, 64 * MiB)
    assert q["memory"] == 264 * MiB == b.cg["rollstack/a"]["mem"]  # 200 MiB + 64 MiB headroom
    assert prov.committed()["memory"] == 264 * MiB


def test_tick_grows_on_pressure_writes_cgroup_and_records_history():
    b = FakeBackend()
    prov = Provisioner(b, PolicyConfig(), NodeCapacity(cpu=2, memory=4 * GiB))
    prov.register("a", "rollstack/a", 0.25, 64 * MiB)
    b.advance()
    b.busy("rollstack/a", 0.25)
    b.cg["rollstack/a"]["usage"] = 64 * MiB
    b.cg["rollstack/a"]["under_oom"] = True
    prov.tick()
    assert b.cg["rollstack/a"]["cpu"] == 1.0 and b.cg["rollstack/a"]["mem"] == 256 * MiB
    h = prov.history("a")
    assert h[-1]["cpu_limit"] == 1.0 and h[-1]["memory_limit"] == 256 * MiB and h[-1]["cpu_usage"] == pytest.approx(0.25)
    ev = prov.events("a")
    assert {(e["resource"], e["old"], e["new"]) for e in ev} == {("cpu", 0.25, 1.0), ("memory", 64 * MiB, 256 * MiB)}
    assert all(e["t"] > 1e9 for e in ev)  # wall-clock seconds, not monotonic
    assert prov.write_latency()["count"] >= 4


def test_refused_memory_shrink_keeps_the_applied_limit():
    b = FakeBackend()
    cfg = PolicyConfig(shrink_after_s=0.2)
    prov = Provisioner(b, cfg, NodeCapacity(cpu=2, memory=4 * GiB))
    prov.register("a", "rollstack/a", 0.25, 64 * MiB)
    b.advance()
    b.cg["rollstack/a"]["under_oom"] = True
    b.cg["rollstack/a"]["usage"] = 64 * MiB
    prov.tick()
    b.cg["rollstack/a"]["under_oom"] = False
    b.cg["rollstack/a"]["usage"] = 1 * MiB
    b.refuse_shrink_below["rollstack/a"] = 10 * GiB  # the "kernel" refuses every shrink
    for _ in range(5):
        b.advance()
        prov.tick()
    assert prov.quotas("a")["memory"] == 256 * MiB
    assert any(e["signal"] == "write_refused" for e in prov.events("a"))


def test_terminate_callback_gets_reason_with_quota_history():
    b = FakeBackend()
    got = []
    cfg = PolicyConfig(oom_terminate_samples=3)
    prov = Provisioner(b, cfg, NodeCapacity(cpu=2, memory=4 * GiB), on_terminate=lambda e, r: got.append((e, r)))
    prov.register("hog", "rollstack/hog", 0.5, 64 * MiB, max_memory=128 * MiB)
    c = b.cg["rollstack/hog"]
    for _ in range(8):
        b.advance()
        c["usage"] = c["mem"]
        c["under_oom"] = True
        prov.tick()
    assert len(got) == 1  # reported once, then no longer sampled
    env_id, reason = got[0]
    assert reason["code"] == "oom_terminated" and reason["cause"] == "oom_at_cap"
    assert reason["peak_memory"] == 128 * MiB and reason["consecutive_samples"] == 4
    assert [h["memory_limit"] for h in reason["quota_history"]] == [64 * MiB, 128 * MiB]
    assert prov.quotas("hog")["status"] == "terminated"
    assert prov.committed()["memory"] == 128 * MiB  # still counted until unregister
    prov.unregister("hog")
    assert prov.committed()["memory"] == 0


def test_default_termination_kills_the_cgroup():
    b = FakeBackend()
    prov = Provisioner(b, PolicyConfig(oom_terminate_samples=1), NodeCapacity(cpu=2, memory=4 * GiB))
    prov.register("hog", "rollstack/hog", 0.5, 64 * MiB, max_memory=64 * MiB)
    c = b.cg["rollstack/hog"]
    for _ in range(3):
        b.advance()
        c["usage"], c["under_oom"] = c["mem"], True
        prov.tick()
    assert c["procs"] == []


def test_reclaim_from_idle_env_then_grow():
    b = FakeBackend()
    prov = Provisioner(b, PolicyConfig(), NodeCapacity(cpu=2, memory=1 * GiB))
    prov.register("idle", "rollstack/idle", 0.25, 64 * MiB)
    prov.register("busy", "rollstack/busy", 0.25, 64 * MiB)
    # the idle one grew earlier to 512 MiB and is now nearly empty
    b.advance()
    b.cg["rollstack/idle"].update(usage=64 * MiB, under_oom=True)
    prov.tick()
    b.advance()
    b.cg["rollstack/idle"].update(usage=250 * MiB, under_oom=True)
    prov.tick()
    idle_q = prov.quotas("idle")["memory"]
    n = prov.committed()
    line = n["capacity_memory"] - n["reserve_memory"]
    assert idle_q > 256 * MiB and line - 4096 < n["memory"] <= line  # grew up to the line, page-aligned
    b.advance()
    b.cg["rollstack/idle"].update(usage=2 * MiB, under_oom=False)
    b.cg["rollstack/busy"].update(usage=64 * MiB, under_oom=True)
    prov.tick()
    ev = prov.events("idle")
    assert any(e["signal"] == "reclaim" for e in ev)
    assert prov.quotas("idle")["memory"] < idle_q and prov.quotas("idle")["memory"] >= 64 * MiB
    assert prov.quotas("busy")["memory"] == 256 * MiB
    n = prov.committed()
    assert n["memory"] <= n["capacity_memory"] - n["reserve_memory"]


def test_vanished_cgroup_and_metrics():
    b = FakeBackend()
    reg = CollectorRegistry()
    prov = Provisioner(b, PolicyConfig(), NodeCapacity(cpu=2, memory=4 * GiB), registry=reg)
    prov.register("a", "rollstack/a", 0.5, 128 * MiB)
    b.advance()
    prov.tick()
    text = generate_latest(reg).decode()
    assert 'rollstack_env_cpu_limit_cores{env="a"} 0.5' in text
    assert "rollstack_node_reserve_memory_bytes" in text and "rollstack_provision_samples_total" in text
    del b.cg["rollstack/a"]
    b.advance()
    prov.tick()
    prov.tick()
    assert [e["signal"] for e in prov.events("a")] == ["cgroup_gone"]
    assert prov.committed()["memory"] == 0


def test_a_failing_write_is_an_event_and_other_envs_still_get_their_tick():
    class Flaky(FakeBackend):
        def set_cpu(self, path, cores):
            if path == "rollstack/bad" and cores != 0.25:
                raise RuntimeFailure("cannot write cpu.cfs_quota_us", path=path)
            super().set_cpu(path, cores)

    b = Flaky()
    prov = Provisioner(b, PolicyConfig(), NodeCapacity(cpu=2, memory=4 * GiB))
    prov.register("bad", "rollstack/bad", 0.25, 64 * MiB)
    prov.register("good", "rollstack/good", 0.25, 64 * MiB)
    b.advance()
    b.busy("rollstack/bad", 0.25)
    b.busy("rollstack/good", 0.25)
    prov.tick()
    assert prov.events("bad")[-1]["signal"] == "write_failed" and prov.quotas("bad")["status"] == "active"
    assert prov.quotas("bad")["cpu"] == 0.25 and prov.quotas("good")["cpu"] == 1.0


def test_thread_start_stop_and_loop_cost():
    b = FakeBackend()
    prov = Provisioner(b, PolicyConfig(sample_period_s=0.01), NodeCapacity(cpu=2, memory=4 * GiB))
    prov.register("a", "rollstack/a", 0.5, 128 * MiB)
    import time

    with prov:
        time.sleep(0.15)
    cost = prov.loop_cost()
    assert cost["ticks"] >= 3 and cost["samples"] >= 3 and cost["percent_of_core"] >= 0
    prov.stop()  # idempotent
