"""Task schema (SWE-smith fields), tasks.jsonl round trip, manifest helpers, task selection."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rollstack.tasks.model import Component, CorpusManifest, dump_tasks, load_tasks, validate_tasks
from rollstack.errors import InvalidRequest
from task_helpers import task

def test_round_trip_and_schema_order() -> None:
    ts = [task(), task(instance_id="r.1.op_swap__1")]
    text = dump_tasks(ts)
    assert text.count("\n") == 2
    assert text.splitlines()[0].startswith('{"instance_id": "r.1.op_swap__0", "repo": "r", "patch":')
    assert load_tasks(text) == ts


@pytest.mark.parametrize("bad", [
    {"instance_id": "has space"}, {"instance_id": "../x"}, {"patch": "not a diff"},
    {"fix": "--- a/x\n+++ b/x\n"}, {"workdir": "work/r"}, {"workdir": "/work/../etc"},
])
def test_invalid_tasks_are_rejected(bad) -> None:
    with pytest.raises(ValidationError):
        task(**bad)


@pytest.mark.parametrize("missing", [{"FAIL_TO_PASS": []}, {"fix": None}, {"test_command": None}, {"workdir": None},
                                     {"patch": ""}])
def test_a_corpus_task_must_be_complete(missing) -> None:
    task(**missing)  # a task file may leave it out...
    with pytest.raises(InvalidRequest, match="a corpus task needs"):
        validate_tasks([task(**missing)])  # ...the corpus may not


def test_corpus_level_checks() -> None:
    with pytest.raises(InvalidRequest, match="duplicate"):
        validate_tasks([task(), task()])
    with pytest.raises(InvalidRequest, match="both"):
        validate_tasks([task(PASS_TO_PASS=["t.py::a"])])
    with pytest.raises(InvalidRequest, match="line 2"):
        load_tasks(dump_tasks([task()]) + '{"instance_id": "x"}\n')


def test_manifest_stack_sums() -> None:
    m = CorpusManifest(flavor="small", tasks=4, components=[
        Component(name="os", kind="os", group="os/d:b", bytes=100, files=10),
        Component(name="repo-r", kind="repo", group="repo/r:1", base="os", bytes=5, files=2),
        Component(name="harness-h", kind="harness", group="harness/h:1", base="os", bytes=50, files=7),
    ])
    assert m.stack_bytes(["os", "repo-r", "harness-h"]) == 155
    assert m.stack_files(["os", "harness-h"]) == 17
    with pytest.raises(InvalidRequest):
        m.component("nope")


def test_plan_for_task_stacks_groups_and_scores_with_the_evaluator() -> None:
    from rollstack.tasks.plans import plan_for_task

    m = CorpusManifest(flavor="small", tasks=1, components=[
        Component(name="os", kind="os", group="os/debian-python:bookworm"),
        Component(name="repo-r", kind="repo", group="repo/r:1", base="os"),
        Component(name="harness-mini-swe-agent", kind="harness", group="harness/mini-swe-agent:2.4.6", base="os"),
        Component(name="evaluator", kind="evaluator", group="evaluator/pytest:8.3.4", base="os"),
    ])
    plan = plan_for_task(m, task(), mutation="r.diff")
    assert plan["groups"] == ["os/debian-python:bookworm", "repo/r:1", "harness/mini-swe-agent:2.4.6"]
    assert plan["evaluator"]["groups"][-1] == "evaluator/pytest:8.3.4"
    assert plan["evaluator"]["command"][-1].endswith("/tasks/r.1.op_swap__0.json")
    assert plan["workdir"] == "/work/r" and plan["mutation"] == "r.diff"
    with pytest.raises(InvalidRequest):
        plan_for_task(m, task(), harness="claude-code")
