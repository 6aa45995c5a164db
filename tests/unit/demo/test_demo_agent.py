"""The scripted agent's control flow against a fake node: steps, failures, capacity retries,
cancellation; the environment is destroyed on every path."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from rollstack_demo import agent
from rollstack.tasks.plans import StackGroups
from rollstack.errors import InsufficientCapacity, MutationFailed
from rollstack.contract.models import CreateResponse, Evaluation, ExecResult

GROUPS = StackGroups(os="os/x:1", repos={"pkg": "repo/pkg:1"}, harness="harness/h:1", evaluator="evaluator/e:1")
DIFF = "diff --git a/p b/p\n--- a/p\n+++ b/p\n@@ -1 +1 @@\n-a\n+b\n"
TASK = {"instance_id": "pkg.1.t__0", "repo": "pkg", "patch": DIFF, "fix": DIFF, "workdir": "/work/pkg",
        "FAIL_TO_PASS": ["tests/test_p.py::test_a"], "PASS_TO_PASS": [], "test_command": "pytest"}


class FakeEnv:
    def __init__(self, node: "FakeNode") -> None:
        self.node, self.id = node, f"e{len(node.envs)}"
        self.created = CreateResponse(id=self.id)
        self.fixed = False
        self.destroyed = 0

    def exec(self, command: Any, timeout: float | None = None, stdin: str | None = None, **_: Any) -> ExecResult:
        self.node.commands.append(command)
        if isinstance(command, list) and command[:2] == ["git", "apply"]:
            self.fixed = self.node.fix_applies
            return ExecResult(exit_code=0 if self.fixed else 1, stderr="" if self.fixed else "patch failed")
        return ExecResult(exit_code=0 if self.fixed else 1, duration=0.5)

    def diff(self) -> str:
        return "" if self.fixed else DIFF

    def evaluate(self) -> Evaluation:
        if self.node.eval_refusals > 0:
            self.node.eval_refusals -= 1
            raise InsufficientCapacity("full")
        return Evaluation(reward=1.0 if self.fixed else 0.0, exit_code=0 if self.fixed else 1,
                          timings={"total": 2.0, "run": 1.5})

    def destroy(self) -> None:
        self.destroyed += 1


class FakeNode:
    def __init__(self, create_error: Exception | None = None, fix_applies: bool = True, eval_refusals: int = 0):
        self.envs: list[FakeEnv] = []
        self.commands: list[Any] = []
        self.create_error, self.fix_applies, self.eval_refusals = create_error, fix_applies, eval_refusals

    def create(self, plan: dict[str, Any]) -> FakeEnv:
        if self.create_error is not None:
            raise self.create_error
        env = FakeEnv(self)
        self.envs.append(env)
        return env


@pytest.fixture(autouse=True)
def _fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent.time, "sleep", lambda s: None)


def test_a_good_rollout_fails_then_passes_and_scores() -> None:
    node = FakeNode()
    rec = agent.run_rollout(node, TASK, GROUPS, 2)
    assert rec.error is None and rec.reward == 1.0 and rec.bug_reproduced and rec.fixed
    assert rec.diff_files == 0 and rec.eval_seconds == 2.0 and rec.eval_run_seconds == 1.5
    assert node.envs[0].destroyed == 1 and rec.destroy_seconds is not None
    assert node.commands[1][:2] == ["git", "apply"]


def test_control_without_fix_keeps_the_bug_as_its_diff() -> None:
    node = FakeNode()
    rec = agent.run_rollout(node, TASK, GROUPS, 0, apply_fix=False)
    assert rec.fix is None and rec.reward == 0.0 and rec.diff_files == 1 and not rec.fixed
    assert not any(isinstance(c, list) for c in node.commands)


def test_a_fix_that_does_not_apply_is_an_error_but_the_rollout_is_still_scored() -> None:
    node = FakeNode(fix_applies=False)
    rec = agent.run_rollout(node, TASK, GROUPS, 0)
    assert rec.error is not None and rec.error.startswith("fix_failed") and "patch failed" in rec.error
    assert rec.reward == 0.0 and node.envs[0].destroyed == 1


def test_create_failures_are_recorded_with_their_code() -> None:
    rec = agent.run_rollout(FakeNode(create_error=MutationFailed("does not apply")), TASK, GROUPS, 0)
    assert rec.error == "mutation_failed: does not apply" and rec.env_id is None and rec.reward is None


def test_insufficient_capacity_is_retried_then_succeeds() -> None:
    node = FakeNode(eval_refusals=3)
    rec = agent.run_rollout(node, TASK, GROUPS, 0)
    assert rec.error is None and rec.reward == 1.0 and rec.capacity_retries == 3


def test_insufficient_capacity_gives_up_after_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent, "CAPACITY_WAIT", 1.0)
    rec = agent.run_rollout(FakeNode(create_error=InsufficientCapacity("node is full")), TASK, GROUPS, 0)
    assert rec.error == "insufficient_capacity: node is full" and rec.capacity_retries >= 1


def test_cancel_stops_before_the_next_step_and_destroys() -> None:
    cancel = threading.Event()
    node = FakeNode()
    original = FakeEnv.exec

    def exec_then_cancel(self: FakeEnv, *a: Any, **kw: Any) -> ExecResult:
        cancel.set()
        return original(self, *a, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FakeEnv, "exec", exec_then_cancel)
        rec = agent.run_rollout(node, TASK, GROUPS, 0, cancel=cancel)
    assert rec.error is not None and rec.error.startswith("cancelled")
    assert len(node.commands) == 1 and node.envs[0].destroyed == 1 and rec.reward is None


def test_unexpected_exceptions_are_recorded_not_raised() -> None:
    node = FakeNode(create_error=RuntimeError("boom"))
    rec = agent.run_rollout(node, TASK, GROUPS, 0)
    assert rec.error == "internal_error: RuntimeError: boom"
    assert SimpleNamespace(**rec.to_dict()).fixed is False
