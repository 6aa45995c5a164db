"""SWE-smith task loading and the plan template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollstack.errors import InvalidRequest, PlanInvalid
from rollstack.integrations.tasks import DEMO_TEMPLATE, SweTask, load_tasks, load_template, task_plan
from rollstack.plan.model import load_plan

PATCH = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
TASK = {"instance_id": "more-itertools.10.5.0.op_swap__0", "repo": "more-itertools", "version": "10.5.0",
        "workdir": "/work/more-itertools", "patch": PATCH, "FAIL_TO_PASS": ["tests/t.py::a"],
        "PASS_TO_PASS": ["tests/t.py::b"], "fix": PATCH, "test_command": "python3 -m pytest -q tests/t.py",
        "mutation": {"kind": "op_swap"}}


def test_demo_plan_is_a_valid_plan() -> None:
    plan = task_plan(SweTask.model_validate(TASK))
    assert plan["name"] == TASK["instance_id"]
    assert plan["groups"] == ["os/debian-python:bookworm", "repo/more-itertools:10.5.0", "harness/mini-swe-agent:2.4.6"]
    assert plan["workdir"] == "/work/more-itertools" and plan["mutation_text"] == PATCH
    ev = plan["evaluator"]
    assert ev["groups"][-1] == "evaluator/pytest:8.3.4"
    doc = json.loads(ev["env"]["RS_TASK"])
    assert doc["FAIL_TO_PASS"] == ["tests/t.py::a"] and doc["workdir"] == "/work/more-itertools"
    assert ev["env"]["RS_TEST_COMMAND"] == TASK["test_command"]
    parsed = load_plan(plan)  # the plan model accepts it as is
    assert parsed.evaluator is not None and parsed.mutation_text == PATCH
    assert DEMO_TEMPLATE["groups"][1] == "repo/{repo}:{version}"  # the template is not modified


def test_template_file_and_bad_placeholders(tmp_path: Path) -> None:
    t = tmp_path / "t.yaml"
    t.write_text("groups: [os/busybox:1, 'repo/{repo}:1']\nworkdir: /srv/{repo}\nmutation: old.diff\n")
    plan = task_plan(SweTask.model_validate(TASK), load_template(t))
    assert plan["groups"][1] == "repo/more-itertools:1" and plan["workdir"] == "/srv/more-itertools"
    assert "mutation" not in plan and "evaluator" not in plan
    with pytest.raises(PlanInvalid):
        task_plan(SweTask.model_validate(TASK), {"groups": ["{nope}"]})
    (tmp_path / "list.yaml").write_text("- a\n")
    with pytest.raises(PlanInvalid):
        load_template(tmp_path / "list.yaml")


def test_load_tasks_jsonl_and_json(tmp_path: Path) -> None:
    f = tmp_path / "tasks.jsonl"
    swe_bench_style = TASK | {"instance_id": "x__1", "FAIL_TO_PASS": json.dumps(["a"]), "image_name": "img"}
    f.write_text(json.dumps(TASK) + "\n\n" + json.dumps(swe_bench_style) + "\n")
    tasks = load_tasks(f)
    assert [t.instance_id for t in tasks] == [TASK["instance_id"], "x__1"]
    assert tasks[1].FAIL_TO_PASS == ["a"] and tasks[1].model_extra["image_name"] == "img"
    g = tmp_path / "tasks.json"
    g.write_text(json.dumps([TASK]))
    assert load_tasks(g)[0].fix == PATCH
    bad = tmp_path / "bad.jsonl"
    for text in ("{not json\n", json.dumps({"repo": "r"}) + "\n", (json.dumps(TASK) + "\n") * 2,
                 json.dumps(TASK | {"instance_id": "a b"}) + "\n"):
        bad.write_text(text)
        with pytest.raises(InvalidRequest):
            load_tasks(bad)


def test_prompt_and_workdir_defaults() -> None:
    t = SweTask.model_validate({"instance_id": "o__1", "repo": "owner/name", "FAIL_TO_PASS": [f"t{i}" for i in range(25)]})
    assert t.resolved_workdir() == "/work/name"
    assert "t0" in t.prompt() and "(and 5 more)" in t.prompt()
    assert SweTask.model_validate(TASK | {"problem_statement": "It breaks."}).prompt() == "It breaks."


def _corpus(root: Path) -> Path:
    from rollstack.tasks.model import Component, CorpusManifest

    comps = [Component(name="os", kind="os", group="os/deb:1"),
             Component(name="repo-more-itertools", kind="repo", group="repo/more-itertools:10.5.0", base="os"),
             Component(name="harness-mini-swe-agent", kind="harness", group="harness/mini-swe-agent:2.4.6", base="os"),
             Component(name="evaluator", kind="evaluator", group="evaluator/pytest:9", base="os")]
    (root / "manifest.json").write_text(CorpusManifest(flavor="small", components=comps, tasks=1).model_dump_json())
    return root


def test_corpus_planner_uses_the_corpus_mapping(tmp_path: Path) -> None:
    from rollstack.integrations.tasks import SCORE_COMMAND, corpus_planner

    planner = corpus_planner(_corpus(tmp_path))
    task = SweTask.model_validate(TASK)
    plan = planner(task)
    assert plan["groups"] == ["os/deb:1", "repo/more-itertools:10.5.0", "harness/mini-swe-agent:2.4.6"]
    assert plan["evaluator"]["groups"][-1] == "evaluator/pytest:9"  # from the manifest, not hard-coded
    assert plan["mutation_text"] == PATCH and plan["evaluator"]["command"] == SCORE_COMMAND
    assert json.loads(plan["evaluator"]["env"]["RS_TASK"])["instance_id"] == TASK["instance_id"]
    load_plan(plan)
    # a corpus whose evaluator tree carries the task file: its own scorer command is kept
    f = tmp_path / "evaluator" / "opt" / "rollstack-eval" / "tasks" / f"{TASK['instance_id']}.json"
    f.parent.mkdir(parents=True)
    f.write_text("{}")
    assert planner(task)["evaluator"]["command"][0].endswith("/score")
    # a task of another repository, or without the corpus fields: plan_invalid (the group is given up)
    with pytest.raises(PlanInvalid):
        planner(SweTask.model_validate(TASK | {"repo": "toolz"}))
    with pytest.raises(PlanInvalid):
        planner(SweTask.model_validate({"instance_id": "x", "repo": "more-itertools"}))
    with pytest.raises(InvalidRequest):
        corpus_planner(tmp_path / "nowhere")
