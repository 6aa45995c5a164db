"""The demo's plans: task -> rollout plan (valid for load_plan), the evaluator command, the config."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from rollstack.tasks.plans import (
    EVAL_DIR,
    StackGroups,
    evaluator_command,
    failing_tests_command,
    rollout_plan,
    score_input,
    stack_groups,
)
from rollstack.errors import InvalidRequest
from rollstack.plan.model import load_plan

PATCH = """diff --git a/pkg/mod.py b/pkg/mod.py
--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -1 +1 @@
-x = 1
+x = 2
"""

TASK = {
    "instance_id": "pkg.1.0.op_swap__0", "repo": "pkg", "patch": PATCH,
    "fix": PATCH.replace("-x = 1", "-x = TMP").replace("+x = 2", "-x = 1").replace("-x = TMP", "+x = 2"),
    "FAIL_TO_PASS": ["tests/test_mod.py::test_x[a b]", "tests/test_mod.py::T::test_y"],
    "PASS_TO_PASS": ["tests/test_mod.py::test_z"],
    "test_command": "python3 -m pytest -q tests/test_mod.py", "workdir": "/work/pkg", "version": "1.0",
}
COMPONENTS = [
    {"name": "os", "kind": "os", "group": "os/debian-python:bookworm"},
    {"name": "repo-pkg", "kind": "repo", "group": "repo/pkg:1.0"},
    {"name": "harness-mini-swe-agent", "kind": "harness", "group": "harness/mini-swe-agent:2.4.6"},
    {"name": "evaluator", "kind": "evaluator", "group": "evaluator/pytest:8.3.4"},
]


def test_stack_groups_from_components() -> None:
    g = stack_groups(COMPONENTS)
    assert g == StackGroups(os="os/debian-python:bookworm", repos={"pkg": "repo/pkg:1.0"},
                            harness="harness/mini-swe-agent:2.4.6", evaluator="evaluator/pytest:8.3.4")
    with pytest.raises(InvalidRequest, match="no repository 'other'"):
        g.repo("other")
    with pytest.raises(InvalidRequest, match="no evaluator"):
        stack_groups(COMPONENTS[:3])


def test_rollout_plan_is_a_valid_plan_with_the_bug_and_a_clean_evaluator() -> None:
    plan = load_plan(rollout_plan(TASK, stack_groups(COMPONENTS), 3))
    assert plan.name == "pkg.1.0.op_swap__0-r3"
    assert plan.groups == ["os/debian-python:bookworm", "repo/pkg:1.0", "harness/mini-swe-agent:2.4.6"]
    assert plan.mutation_text == PATCH and plan.workdir == "/work/pkg"
    assert plan.evaluator is not None and plan.evaluator.reward == "exit_code"
    assert plan.evaluator.groups == ["os/debian-python:bookworm", "repo/pkg:1.0", "evaluator/pytest:8.3.4"]
    assert plan.resources.cpu <= plan.resources.max_cpu
    assert plan.fetch.background is False  # no background fill competing with the tests for 2 cores
    assert load_plan(rollout_plan(TASK, stack_groups(COMPONENTS), 0, background_fill=True)).fetch.background


def test_evaluator_command_writes_the_task_and_runs_the_scorer(tmp_path: Path) -> None:
    command = evaluator_command(TASK)
    assert f"exec {EVAL_DIR}/score " in command
    # Run the command's first part with a real shell: the heredoc must yield exactly the task JSON.
    writer = command.split("exec ")[0].replace("/tmp/rollstack-task.json", str(tmp_path / "t.json"))
    subprocess.run(["/bin/sh", "-c", writer], check=True)
    assert json.loads((tmp_path / "t.json").read_text()) == score_input(TASK)
    assert "patch" not in score_input(TASK) and "fix" not in score_input(TASK)


def test_evaluator_command_refuses_a_task_too_big_for_argv() -> None:
    big = dict(TASK, PASS_TO_PASS=[f"tests/test_mod.py::test_{i}" for i in range(10_000)])
    with pytest.raises(InvalidRequest, match="too long"):
        evaluator_command(big)


def test_failing_tests_command_quotes_node_ids() -> None:
    argv = shlex.split(failing_tests_command(TASK))
    assert argv[:4] == ["python3", "-B", "-m", "pytest"] and argv[-2:] == TASK["FAIL_TO_PASS"]


def test_the_evaluator_command_can_be_given():
    argv = ["/opt/rollstack-eval/score", "/opt/rollstack-eval/tasks/x.json"]
    plan = load_plan(rollout_plan(TASK, stack_groups(COMPONENTS), 3, evaluator=argv))
    default = load_plan(rollout_plan(TASK, stack_groups(COMPONENTS), 3))
    assert plan.evaluator.command == argv
    assert plan.model_dump(exclude={"evaluator"}) == default.model_dump(exclude={"evaluator"})
