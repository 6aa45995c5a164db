"""Pure parts of `bench iteration --image`: tasks (their mutation applies and is what the
containerd side writes), agent steps, command defaults, per-phase medians and ratios."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rollstack_bench.iteration.image_run import ImageIterConfig, image_plan, image_report
from rollstack_bench.iteration.image_tasks import (RESULT_FILE, TASK_DIR, TASK_FILE, WRITE_STEP, agent_steps,
                                                   image_commands, make_tasks, phase_medians, ratios)
from rollstack_bench.iteration.rollout import Rollout, jobs
from rollstack.errors import InvalidRequest
from rollstack.plan.model import Plan
from rollstack.plan.mutation import apply_mutation

PY = "oci:/cache/bench-images/python-project:latest"
NODE = "oci:/cache/bench-images/node-project:latest"


def test_tasks_mutation_creates_the_task_file(tmp_path: Path) -> None:
    tasks = make_tasks([PY, NODE], [], 2)
    assert [t["instance_id"] for t in tasks] == ["python-project-0", "python-project-1", "node-project-0", "node-project-1"]
    assert len({t["text"] for t in tasks}) == 4  # every task its own file
    res = apply_mutation(tmp_path, tasks[0]["mutation"], workdir="/")
    assert res.paths == (f"{TASK_DIR.lstrip('/')}/{TASK_FILE}",)
    assert (tmp_path / TASK_DIR.lstrip("/") / TASK_FILE).read_text() == tasks[0]["text"]
    assert make_tasks([PY], [], 1) == make_tasks([PY], [], 1)  # deterministic


def test_steps_and_commands() -> None:
    tasks = make_tasks([PY, NODE], [], 1)
    py, node = tasks[0], tasks[1]
    assert [s for s, _ in py["steps"]] == ["noop", "walk", "command", "read", "cpu", "write"]
    assert "import pytest" in dict(py["steps"])["command"] and "require('express')" in dict(node["steps"])["command"]
    assert py["steps"][-1] == WRITE_STEP and f"sha256sum -c {RESULT_FILE}" in py["eval"]
    assert py["eval"].endswith(dict(py["steps"])["command"])  # eval reruns the image's command
    own = make_tasks([PY], ["true"], 1, task_commands=["ls /", "echo hi"], eval_command="test -s task.txt")[0]
    assert own["steps"] == [("step-1", "ls /"), ("step-2", "echo hi"), WRITE_STEP]
    assert own["eval"].endswith("&& test -s task.txt")
    assert image_commands([PY, NODE], ["a"]) == ["a", "a"]
    assert image_commands([PY, NODE], ["a", "b"]) == ["a", "b"]
    with pytest.raises(InvalidRequest):
        image_commands(["oci:/x/mine:latest"], [])  # not a bench image: its command must be given
    with pytest.raises(InvalidRequest):
        image_commands([PY, NODE], ["a", "b", "c"])
    with pytest.raises(InvalidRequest):
        image_commands([PY, "oci:/other/python-project:latest"], ["a"])  # two images, one name
    with pytest.raises(InvalidRequest):
        agent_steps("x", ["  "])


def test_jobs_spread_over_images_and_plan_is_valid() -> None:
    tasks = make_tasks([PY, NODE], [], 2)
    work = jobs(tasks, 2, 3)
    assert [(t["repo"], k) for t, k in work] == [("python-project", 0), ("python-project", 1), ("python-project", 2),
                                                 ("node-project", 0), ("node-project", 1), ("node-project", 2)]
    plan = Plan.model_validate(image_plan(tasks[0], "bench-group/python-project:latest", 1))
    assert plan.evaluator is not None and plan.evaluator.groups == plan.groups and plan.mutation_text


def _rollout(system: str, task: str, init: float, exec_: float, ev: float, steps: dict[str, float],
             error: str = "") -> Rollout:
    r = Rollout(system, task, 0, reward=0.0 if error else 1.0, error=error, step_s=steps, eval_cmd_s=ev / 2,
                eval_env_init_s=ev / 4)
    r.phases = [{"name": "init", "start": 0.0, "end": init}, {"name": "exec", "start": init, "end": init + exec_},
                {"name": "eval", "start": init + exec_, "end": init + exec_ + ev}]
    return r


def test_medians_and_ratios() -> None:
    rs = [_rollout("rollstack", "python-project-0", 0.2, 3.0, 2.0, {"walk": 1.0, "cpu": 0.5}),
          _rollout("rollstack", "python-project-1", 0.4, 5.0, 4.0, {"walk": 3.0, "cpu": 0.7}),
          _rollout("rollstack", "python-project-2", 9.0, 99.0, 99.0, {"walk": 99.0}, error="boom")]  # left out
    ctd = [_rollout("docker-equivalent", "python-project-0", 2.0, 2.0, 3.0, {"walk": 1.0, "cpu": 0.6, "read": 1.0})]
    m = phase_medians([r.to_dict() for r in rs])
    assert m["init_p50"] == pytest.approx(0.3) and m["exec_p50"] == pytest.approx(4.0)
    assert m["eval_p50"] == pytest.approx(3.0) and m["eval_cmd_p50"] == pytest.approx(1.5)
    assert m["steps_p50"] == {"python-project:cpu": pytest.approx(0.6), "python-project:walk": pytest.approx(2.0)}
    c = phase_medians([r.to_dict() for r in ctd])
    r = ratios({**m, "iteration_s": 10.0}, {**c, "iteration_s": 20.0})
    assert r["iteration_s"] == 0.5 and r["init_p50"] == pytest.approx(0.15) and r["exec_p50"] == pytest.approx(2.0)
    assert r["steps"] == {"python-project:cpu": pytest.approx(1.0), "python-project:walk": pytest.approx(2.0)}
    assert "steps_net" in r and r["steps_net"] == {}  # no noop step measured
    net = ratios({"steps_p50": {"p:noop": 0.01, "p:walk": 0.51, "p:cpu": 0.005}},
                 {"steps_p50": {"p:noop": 0.11, "p:walk": 0.36, "p:cpu": 0.2}})
    assert net["steps"]["p:walk"] == pytest.approx(0.51 / 0.36)
    assert net["steps_net"]["p:walk"] == pytest.approx(0.5 / 0.25) and math.isnan(net["steps_net"]["p:cpu"])
    assert "p:noop" not in net["steps_net"]
    assert math.isnan(ratios({"exec_p50": 1.0}, {"exec_p50": 0.0})["exec_p50"])
    assert math.isnan(phase_medians([])["exec_p50"])

    cfg = ImageIterConfig(images=[PY], modes=["cold"])
    doc = image_report({"rollstack": {"cold": rs}, "docker-equivalent": {"cold": ctd}},
                       {"rollstack": {"cold": 10.0}, "docker-equivalent": {"cold": 20.0}}, cfg, {}, {})
    assert set(doc["systems"]) == {"rollstack-cold", "docker-equivalent-cold"}
    assert doc["systems"]["rollstack-cold"]["errors"] == 1 and doc["ratios"]["cold"]["iteration_s"] == 0.5
    assert 0 < doc["systems"]["rollstack-cold"]["init_share"] < 1
