"""Pure logic of `bench init` / `bench iteration`: summaries, targets, system names, scripted agent."""

from __future__ import annotations

import math
import shlex

import pytest

from rollstack_bench.init import _rounds, comparison, parse_systems, system_summary
from rollstack_bench.iteration.rollout import (PhaseClock, Rollout, agent_steps, harness_command, heredoc,
                                               iteration_summary, jobs)
from rollstack_bench.systems.rollstack import Creation, first_command, import_name
from rollstack.errors import InvalidRequest


def _c(system: str, cold: bool, first: float, fetched: int = 0, ready: float | None = None, code: int = 0) -> Creation:
    return Creation(system, cold, ready if ready is not None else first / 2, first, fetched, fetched, code)


def test_parse_systems_keeps_order_and_rejects_unknown() -> None:
    assert parse_systems("rollstack, docker-equivalent,rollstack") == ["rollstack", "docker-equivalent"]
    with pytest.raises(InvalidRequest):
        parse_systems("rollstack,podman")
    with pytest.raises(InvalidRequest):
        parse_systems(" , ")


def test_system_summary_fields_and_fraction() -> None:
    runs = [_c("rollstack", True, 2.0, 10), _c("rollstack", True, 4.0, 30), _c("rollstack", False, 0.2),
            _c("rollstack", False, 0.4, code=1)]
    s = system_summary(runs, stack_bytes=1000)
    for key in ("cold_init_p50", "cold_init_p95", "warm_init_p50", "fetched_fraction"):
        assert key in s
    assert s["cold_init_p50"] == pytest.approx(3.0)
    assert s["warm_init_p50"] == pytest.approx(0.3)
    assert s["fetched_fraction"] == pytest.approx(0.02)  # mean of cold fetched bytes / stack
    assert s["cold_ready_p50"] == pytest.approx(1.5)
    assert s["failures"] == 1


def test_comparison_speedups_and_targets() -> None:
    systems = {
        "docker-equivalent": system_summary([_c("d", True, 30.0, 500), _c("d", False, 0.5)], 1000),
        "rollstack": system_summary([_c("r", True, 1.0, 10), _c("r", False, 0.2)], 1000),
    }
    t = comparison(systems)
    assert systems["rollstack"]["cold_speedup_p50"] == pytest.approx(30.0)
    assert systems["docker-equivalent"]["cold_speedup_p50"] == pytest.approx(1.0)
    assert t["cold_speedup_p50"]["met"] is True
    assert t["warm_init_p50_s"]["met"] is True
    assert t["fetched_fraction"]["met"] is True
    systems["rollstack"] = system_summary([_c("r", True, 10.0, 100), _c("r", False, 0.5)], 1000)
    t = comparison(systems)
    assert t["cold_speedup_p50"]["met"] is False and t["fetched_fraction"]["met"] is False


def test_comparison_without_baseline_is_nan_not_crash() -> None:
    systems = {"rollstack": system_summary([_c("r", True, 1.0, 10)], 1000)}
    t = comparison(systems)
    assert math.isnan(systems["rollstack"]["cold_speedup_p50"])
    assert t["cold_speedup_p50"]["met"] is None
    assert comparison({"docker-equivalent": systems["rollstack"]}) == {}


def test_rounds() -> None:
    assert _rounds(5, 2) == [2, 2, 1]
    assert _rounds(0, 3) == []
    assert _rounds(3, 8) == [3]


def test_first_command_is_shell_in_workdir() -> None:
    argv = first_command("/work/more-itertools", "more-itertools")
    assert argv[:2] == ["/bin/sh", "-c"]
    assert "cd /work/more-itertools" in argv[2] and "import more_itertools, pytest" in argv[2]
    assert import_name("toolz") == "toolz"


def test_jobs_grpo_order_and_cycling() -> None:
    tasks = [{"instance_id": "a"}, {"instance_id": "b"}]
    js = jobs(tasks, 3, 2)
    assert [(t["instance_id"], k) for t, k in js] == [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("a", 0), ("a", 1)]
    mixed = [{"instance_id": "x1", "repo": "x"}, {"instance_id": "x2", "repo": "x"}, {"instance_id": "y1", "repo": "y"}]
    assert [t["instance_id"] for t, _ in jobs(mixed, 3, 1)] == ["x1", "y1", "x2"]
    with pytest.raises(InvalidRequest):
        jobs([], 1, 1)
    with pytest.raises(InvalidRequest):
        jobs(tasks, 0, 1)


def test_agent_steps_and_heredoc() -> None:
    task = {"FAIL_TO_PASS": ["tests/t.py::T::test_x y"], "fix": "--- a/f\n+++ b/f\n", "mutation": {"path": "pkg/m.py"}}
    steps = agent_steps(task, "/opt/mini-swe-agent/bin/mini --help")
    names = [s[0] for s in steps]
    assert names == ["harness", "read", "test_before", "fix", "test_after"]
    assert steps[0][1] == "/opt/mini-swe-agent/bin/mini --help"
    assert shlex.quote("tests/t.py::T::test_x y") in steps[2][1]
    assert steps[3][2] == task["fix"]
    doc = heredoc("git apply -", "x")
    assert doc.startswith("git apply - <<'") and doc.endswith("\n") and "\nx\n" in doc
    assert heredoc("true", None) == "true"
    with pytest.raises(InvalidRequest):
        heredoc("cat", "ROLLSTACK_PATCH_EOF_7f3a")
    assert harness_command("/opt/c/bin/claude --version") == "/opt/c/bin/claude --version"
    assert harness_command("/opt/x/bin/tool") == "/opt/x/bin/tool --version"
    with pytest.raises(InvalidRequest):
        harness_command("  ")


def test_phase_clock_and_iteration_summary() -> None:
    rec = Rollout("rollstack", "t", 0)
    clock = PhaseClock(rec, t0=0.0)
    assert clock.run("init", lambda: 42) == 42
    with pytest.raises(ValueError):
        clock.run("exec", lambda: (_ for _ in ()).throw(ValueError("x")))
    assert [p["name"] for p in rec.phases] == ["init", "exec"]  # a failing phase is still recorded
    a = Rollout("r", "t", 0, [{"name": "init", "start": 0, "end": 1}, {"name": "exec", "start": 1, "end": 8},
                              {"name": "eval", "start": 8, "end": 10}], reward=1.0)
    b = Rollout("r", "t", 1, [{"name": "init", "start": 0, "end": 3}, {"name": "exec", "start": 3, "end": 10}],
                reward=0.0, error="x", eval_env_init_s=1.0)
    s = iteration_summary([a, b], wall=10.0)
    assert s["env_init_share"] == pytest.approx(5 / 20)
    assert s["rollouts"] == 2 and s["ok"] == 1 and s["errors"] == 1
    assert s["init_share"] == pytest.approx(4 / 20)
    assert s["init_p50"] == pytest.approx(2.0)


def test_work_lock_refuses_a_second_run(tmp_path) -> None:
    from rollstack_bench.systems.rollstack import work_lock

    with work_lock(tmp_path / "w"):
        with pytest.raises(InvalidRequest):
            with work_lock(tmp_path / "w"):
                pass
    with work_lock(tmp_path / "w"):  # released on exit
        pass


def test_rollstack_system_plan_sets_fetch_mode(tmp_path) -> None:
    from rollstack_bench.systems.rollstack import RollstackSystem

    plan = {"name": "p", "groups": ["os/x:1"], "fetch": {"background": True}}
    eager = RollstackSystem("rollstack-eager", "http://127.0.0.1:1", tmp_path).plan(plan)
    lazy = RollstackSystem("rollstack", "http://127.0.0.1:1", tmp_path).plan(plan)
    assert eager["fetch"] == {"eager": True, "background": False}
    assert lazy["fetch"] == {"eager": False, "background": False}
    assert plan["fetch"] == {"background": True}  # the caller's plan is not modified
    with pytest.raises(ValueError):
        RollstackSystem("docker-equivalent", "http://127.0.0.1:1", tmp_path)


def test_retry_capacity_retries_only_insufficient_capacity() -> None:
    from rollstack_bench.iteration.systems import retry_capacity
    from rollstack.errors import InsufficientCapacity

    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise InsufficientCapacity("full")
        return "ok"

    slept: list[float] = []
    assert retry_capacity(flaky, sleep=slept.append) == "ok" and len(slept) == 2
    with pytest.raises(InvalidRequest):
        retry_capacity(lambda: (_ for _ in ()).throw(InvalidRequest("bad")), sleep=slept.append)
    with pytest.raises(InsufficientCapacity):
        retry_capacity(lambda: (_ for _ in ()).throw(InsufficientCapacity("full")), attempts=2, sleep=slept.append)


def test_node_options_parse_json_values_and_reject_bare_words():
    import pytest

    from rollstack_bench.init import parse_node_options
    from rollstack.errors import InvalidRequest

    assert parse_node_options(["erofs_lowers=false", "erofs_wait=5", "name=x=y"]) == {
        "erofs_lowers": False, "erofs_wait": 5, "name": "x=y"}
    with pytest.raises(InvalidRequest, match="KEY=VALUE"):
        parse_node_options(["erofs_lowers"])
