"""Pure: a task -> its plan (`task_plan`, the one builder), the evaluator's command, the scripted
agent's commands.

A rollout stacks os + repository + harness with the task's bug as its mutation; its evaluator
is a clean os + repository + evaluator stack, where the rollout's diff is applied (by the node)
and the corpus's scorer (`<EVAL_DIR>/score TASK.json`) runs the task's tests: it exits 0 iff every
FAIL_TO_PASS and PASS_TO_PASS test passes, so the reward is the exit code's verdict.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any, Mapping, Union

from rollstack.errors import InvalidRequest
from rollstack.tasks.model import CorpusManifest, Task

EVAL_DIR = "/opt/rollstack-eval"
"""Where the corpus's evaluator group installs its scorer (rollstack_corpus builds it there)."""
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


def stack_groups(components: list[dict[str, Any]], harness: str | None = None) -> StackGroups:
    """From the corpus manifest's components (`name`, `kind`, `group`): the first of each kind
    (the harness named `harness-<harness>` when `harness` is given)."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for c in components:
        by_kind.setdefault(c["kind"], []).append(c)
    for kind in ("os", "repo", "harness", "evaluator"):
        if not by_kind.get(kind):
            raise InvalidRequest(f"the corpus has no {kind} component")
    repos = {c["name"].removeprefix("repo-"): c["group"] for c in by_kind["repo"]}
    harnesses = [c for c in by_kind["harness"] if harness is None or c["name"] == f"harness-{harness}"]
    if not harnesses:
        raise InvalidRequest(f"no component 'harness-{harness}' in corpus")
    return StackGroups(os=by_kind["os"][0]["group"], repos=repos,
                       harness=harnesses[0]["group"], evaluator=by_kind["evaluator"][0]["group"])


TaskLike = Union[Task, Mapping[str, Any]]
"""A `Task`, or a mapping in its schema (validated into one)."""


def as_task(task: TaskLike) -> Task:
    return task if isinstance(task, Task) else Task.model_validate(dict(task))


def score_input(task: TaskLike) -> dict[str, Any]:
    """The fields the scorer reads (the rest of a task, e.g. the patch, stays out of the evaluator)."""
    return as_task(task).score_document()


def evaluator_command(task: TaskLike) -> str:
    """Shell command: write the task file, run the scorer (exit 0 iff reward 1.0, JSON verdict on stdout)."""
    doc = json.dumps(score_input(task), separators=(",", ":"))
    command = (f"cat > {TASK_FILE} <<'{_EOF}'\n{doc}\n{_EOF}\n"
               f"exec {EVAL_DIR}/score {TASK_FILE}\n")
    if len(command.encode()) > MAX_COMMAND_BYTES:
        raise InvalidRequest(f"task {as_task(task).instance_id}: its test lists are too long to pass to the scorer")
    return command


def task_plan(task: TaskLike, groups: StackGroups, *, name: str | None = None,
              evaluator: str | list[str] | None = None, mutation: str | None = None,
              env: dict[str, str] | None = None, resources: dict[str, Any] | None = None,
              timeout: float | None = None, fetch: dict[str, Any] | None = None,
              evaluator_timeout: float | None = None) -> dict[str, Any]:
    """The plan (interface.md shape, a dict `load_plan` accepts) of one environment for `task`.

    The environment stacks os + the task's repository + the harness with the task's bug as its
    mutation (inline, or the file `mutation` names relative to the plan file); its evaluator
    stacks os + repository + evaluator and runs `evaluator` (default: `evaluator_command(task)`,
    the scorer with the task written by the command itself), reward = the exit code's verdict.
    The other arguments are the plan's fields of the same name, left out when None.
    """
    t = as_task(task)
    repo = groups.repo(t.repo)
    plan: dict[str, Any] = {"name": name or t.instance_id, "groups": [groups.os, repo, groups.harness]}
    if mutation is not None:
        plan["mutation"] = mutation
    elif t.patch:
        plan["mutation_text"] = t.patch
    plan["workdir"] = t.resolved_workdir()
    for key, value in (("env", env), ("resources", resources), ("timeout", timeout), ("fetch", fetch)):
        if value is not None:
            plan[key] = value
    plan["evaluator"] = {
        "groups": [groups.os, repo, groups.evaluator],
        "command": evaluator if evaluator is not None else evaluator_command(t),
        "reward": "exit_code",
    }
    if evaluator_timeout is not None:
        plan["evaluator"]["timeout"] = evaluator_timeout
    return plan


def rollout_plan(task: TaskLike, groups: StackGroups, rollout: int, *,
                 background_fill: bool = False, evaluator: str | list[str] | None = None) -> dict[str, Any]:
    """The plan of rollout `rollout` of `task`: `task_plan` with the demo's quotas and timeouts.

    Background fill is off by default: the scripted agent reads ~3% of the stack, and filling the
    rest (a 700 MB harness) in the background competes with the tests for this machine's 2 cores
    (measured: a cold `python3 -m pytest --version` 1.2 s without, 9.8 s with; docs/demo.md)."""
    t = as_task(task)
    return task_plan(t, groups, name=f"{t.instance_id}-r{rollout}", evaluator=evaluator,
                     resources=dict(RESOURCES), timeout=1800, fetch={"background": background_fill},
                     evaluator_timeout=600)


def failing_tests_command(task: TaskLike) -> str:
    """What the agent runs first and last: only the tests the bug breaks. `-B`: no bytecode is
    written, because a .pyc written by the first run records the buggy source's mtime in whole
    seconds and its size; a same-size fix (an operator swapped) applied within that second
    would then be run from the stale .pyc (seen in CI once environments got fast enough)."""
    ids = " ".join(shlex.quote(t) for t in as_task(task).FAIL_TO_PASS)
    return f"python3 -B -m pytest -p no:cacheprovider -q {ids}"


FIX_ARGV = ["git", "apply", "--verbose", "-"]
"""The agent's edit: the reference fix, a unified diff on stdin, applied from the workdir."""


def plan_for_task(manifest: CorpusManifest, task: Task, harness: str = "mini-swe-agent",
                  mutation: str | None = None) -> dict[str, Any]:
    """A plan for one rollout of `task` with `harness`, scored by the task's file in the evaluator
    tree (`score tasks/<id>.json`); `mutation` is the path of a file holding `task.patch`
    (relative to the plan file), else the patch goes inline."""
    groups = stack_groups([c.model_dump() for c in manifest.components], harness=harness)
    score = [f"{EVAL_DIR}/score", f"{EVAL_DIR}/tasks/{task.instance_id}.json"]
    return task_plan(task, groups, evaluator=score, mutation=mutation, env={"PYTHONDONTWRITEBYTECODE": "1"})
