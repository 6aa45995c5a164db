"""Pure: a corpus task -> the rollout's plan, the evaluator's command, the scripted agent's commands.

A rollout stacks os + repository + harness with the task's bug as its mutation; its evaluator
is a clean os + repository + evaluator stack, where the rollout's diff is applied (by the node)
and the corpus's scorer (`<EVAL_DIR>/score TASK.json`) runs the task's tests: it exits 0 iff every
FAIL_TO_PASS and PASS_TO_PASS test passes, so the reward is the exit code's verdict.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from rollstack.errors import InvalidRequest

EVAL_DIR = "/opt/rollstack-eval"
"""Where the corpus's evaluator group installs its scorer (rollstack.corpus.spec.EVAL_DIR)."""
TASK_FILE = "/tmp/rollstack-task.json"
"""Where the evaluator command writes the task before scoring (/tmp is never part of a diff)."""
_EOF = "ROLLSTACK_TASK_EOF"
MAX_COMMAND_BYTES = 120_000
"""Linux caps one argv string at 128 KiB (MAX_ARG_STRLEN); the task travels inside the command."""

RESOURCES = {"cpu": 1.0, "memory": "512Mi", "max_cpu": 2.0, "max_memory": "4Gi"}
"""Start quotas and caps of every demo environment (the provisioner grows them under pressure)."""


@dataclass(frozen=True)
class StackGroups:
    """The corpus's group references (NAME:TAG) the demo stacks."""

    os: str
    repos: dict[str, str]
    """repository name (a task's `repo`) -> its group"""
    harness: str
    evaluator: str

    def repo(self, name: str) -> str:
        try:
            return self.repos[name]
        except KeyError:
            raise InvalidRequest(f"the corpus has no repository {name!r} (has {sorted(self.repos)})") from None


def stack_groups(components: list[dict[str, Any]]) -> StackGroups:
    """From the corpus manifest's components (`name`, `kind`, `group`): the first of each kind."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for c in components:
        by_kind.setdefault(c["kind"], []).append(c)
    for kind in ("os", "repo", "harness", "evaluator"):
        if not by_kind.get(kind):
            raise InvalidRequest(f"the corpus has no {kind} component")
    repos = {c["name"].removeprefix("repo-"): c["group"] for c in by_kind["repo"]}
    return StackGroups(os=by_kind["os"][0]["group"], repos=repos,
                       harness=by_kind["harness"][0]["group"], evaluator=by_kind["evaluator"][0]["group"])


def score_input(task: dict[str, Any]) -> dict[str, Any]:
    """The fields the scorer reads (the rest of a task, e.g. the patch, stays out of the evaluator)."""
    keys = ("instance_id", "workdir", "test_command", "FAIL_TO_PASS", "PASS_TO_PASS")
    return {k: task[k] for k in keys if k in task}


def evaluator_command(task: dict[str, Any]) -> str:
    """Shell command: write the task file, run the scorer (exit 0 iff reward 1.0, JSON verdict on stdout)."""
    doc = json.dumps(score_input(task), separators=(",", ":"))
    command = (f"cat > {TASK_FILE} <<'{_EOF}'\n{doc}\n{_EOF}\n"
               f"exec {EVAL_DIR}/score {TASK_FILE}\n")
    if len(command.encode()) > MAX_COMMAND_BYTES:
        raise InvalidRequest(f"task {task.get('instance_id')}: its test lists are too long to pass to the scorer")
    return command


def rollout_plan(task: dict[str, Any], groups: StackGroups, rollout: int, *,
                 background_fill: bool = False, evaluator: str | list[str] | None = None) -> dict[str, Any]:
    """The plan of rollout `rollout` of `task` (a dict in the corpus's task schema).

    Background fill is off by default: the scripted agent reads ~3% of the stack, and filling the
    rest (a 700 MB harness) in the background competes with the tests for this machine's 2 cores
    (measured: a cold `python3 -m pytest --version` 1.2 s without, 9.8 s with; docs/demo.md).
    `evaluator`: the scorer command (default: `evaluator_command(task)`, the task file written by
    the command itself)."""
    repo = groups.repo(task["repo"])
    return {
        "name": f"{task['instance_id']}-r{rollout}",
        "groups": [groups.os, repo, groups.harness],
        "mutation_text": task["patch"],
        "workdir": task["workdir"],
        "resources": dict(RESOURCES),
        "timeout": 1800,
        "fetch": {"background": background_fill},
        "evaluator": {
            "groups": [groups.os, repo, groups.evaluator],
            "command": evaluator if evaluator is not None else evaluator_command(task),
            "reward": "exit_code",
            "timeout": 600,
        },
    }


def failing_tests_command(task: dict[str, Any]) -> str:
    """What the agent runs first and last: only the tests the bug breaks."""
    ids = " ".join(shlex.quote(t) for t in task["FAIL_TO_PASS"])
    return f"python3 -m pytest -p no:cacheprovider -q {ids}"


FIX_ARGV = ["git", "apply", "--verbose", "-"]
"""The agent's edit: the reference fix, a unified diff on stdin, applied from the workdir."""
