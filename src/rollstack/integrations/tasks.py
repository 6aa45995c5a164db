"""SWE-smith task records -> rollstack plans, through a plan template.

A task file is JSON lines in the SWE-smith schema: `instance_id`, `repo`, `patch` (the bug, a
unified diff relative to the repository workdir), `FAIL_TO_PASS`, `PASS_TO_PASS`, and optionally
`fix` (the reference solution), `test_command`, `workdir`, `version`, `problem_statement`. Other
fields are kept.

A plan template is a plan (YAML/dict) whose strings may name task fields as `{repo}`,
`{version}`, `{instance_id}`, `{workdir}`, `{test_command}`. `task_plan()` fills them in, sets
the plan's name to the instance id, its mutation to the task's `patch` and its workdir to the
task's, and hands the evaluator the task: `RS_TASK` (the JSON the demo corpus's scorer
`/opt/rollstack-eval/score` reads) and `RS_TEST_COMMAND` in the evaluator's environment.

`DEMO_TEMPLATE` is the demo corpus's layout (`rollstack bench corpus build --small`): groups
os/..., repo/..., harness/..., and the evaluator group with its pytest scorer. With the built
corpus at hand, `corpus_planner(root)` takes the mapping from the corpus module itself
(`rollstack.tasks.plans.plan_for_task`: group names from its manifest) instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import yaml
from pydantic import ValidationError

from rollstack.tasks.model import CorpusManifest, Task, validate_tasks
from rollstack.tasks.plans import EVAL_DIR, plan_for_task
from rollstack.errors import InvalidRequest, PlanInvalid

SCORE_COMMAND = 'printf "%s" "$RS_TASK" > /tmp/rs-task.json && exec /opt/rollstack-eval/score /tmp/rs-task.json'
"""The demo corpus's evaluator: the task's tests with a pinned pytest; exit 0 iff all pass."""

DEMO_TEMPLATE: dict[str, Any] = {
    "groups": [
        "os/debian-python:bookworm",
        "repo/{repo}:{version}",
        "harness/mini-swe-agent:2.4.6",
    ],
    "workdir": "{workdir}",
    "env": {"PYTHONDONTWRITEBYTECODE": "1"},
    "resources": {"cpu": 1, "memory": "1Gi", "max_cpu": 2, "max_memory": "4Gi"},
    "timeout": 1800,
    "evaluator": {
        "groups": ["os/debian-python:bookworm", "repo/{repo}:{version}", "evaluator/pytest:8.3.4"],
        "command": SCORE_COMMAND,
        "reward": "exit_code",
        "timeout": 900,
    },
}

Planner = Callable[[Task], dict[str, Any]]

_FIELDS = ("repo", "version", "instance_id", "workdir", "test_command")


SweTask = Task
"""The name this module has always exported: the one task model, `rollstack.tasks.model.Task`."""


def load_tasks(path: str | Path) -> list[SweTask]:
    """Tasks from a JSONL (or JSON array) file; InvalidRequest names the bad record."""
    text = Path(path).read_text()
    if text.lstrip().startswith("["):
        records = json.loads(text)
    else:
        records = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except ValueError as exc:
                    raise InvalidRequest(f"{path}:{n}: not JSON: {exc}") from exc
    tasks = []
    for n, rec in enumerate(records, 1):
        try:
            tasks.append(SweTask.model_validate(rec))
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in err["loc"])
            raise InvalidRequest(f"{path}: task {n}: {loc}: {err['msg']}") from exc
    seen: set[str] = set()
    for t in tasks:
        if t.instance_id in seen:
            raise InvalidRequest(f"{path}: duplicate instance_id {t.instance_id}")
        seen.add(t.instance_id)
    return tasks


def load_template(path: str | Path | None) -> dict[str, Any]:
    """A plan template from a YAML/JSON file (None: DEMO_TEMPLATE)."""
    if path is None:
        return json.loads(json.dumps(DEMO_TEMPLATE))
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise PlanInvalid(f"plan template {path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise PlanInvalid(f"plan template {path}: not a mapping")
    return doc


def _fill(value: Any, fields: dict[str, str]) -> Any:
    if isinstance(value, str):
        try:
            return value.format_map(fields)
        except (KeyError, ValueError, IndexError) as exc:
            raise PlanInvalid(f"plan template: cannot fill {value!r}: {exc!r} (known: {', '.join(_FIELDS)})") from exc
    if isinstance(value, list):
        return [_fill(v, fields) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, fields) for k, v in value.items()}
    return value


def task_plan(task: SweTask, template: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan (a dict the node accepts) for one task."""
    fields = {
        "repo": task.repo,
        "version": task.version,
        "instance_id": task.instance_id,
        "workdir": task.resolved_workdir(),
        "test_command": task.test_command or "",
    }
    plan = _fill(template if template is not None else DEMO_TEMPLATE, fields)
    plan["name"] = task.instance_id
    plan.setdefault("workdir", fields["workdir"])
    plan.pop("mutation", None)
    if task.patch:
        plan["mutation_text"] = task.patch
    evaluator = plan.get("evaluator")
    if isinstance(evaluator, dict):
        env = dict(evaluator.get("env") or {})
        env.setdefault("RS_TASK", json.dumps(task.score_document(), separators=(",", ":")))
        env.setdefault("RS_TEST_COMMAND", fields["test_command"])
        evaluator["env"] = env
    return plan


def template_planner(template: dict[str, Any] | None = None) -> Planner:
    """task -> plan through a plan template (None: DEMO_TEMPLATE)."""
    return lambda task: task_plan(task, template)


def corpus_planner(root: str | Path, harness: str = "mini-swe-agent") -> Planner:
    """task -> plan from a built corpus directory (manifest.json), via `rollstack.tasks.plans.
    plan_for_task`, with the task's bug inline and the task handed to the scorer.

    Corpora built before the evaluator tree carried one JSON per task get the scorer command of
    `DEMO_TEMPLATE` (the task travels in `RS_TASK`) instead of `score tasks/<id>.json`."""
    root = Path(root)
    try:
        manifest = CorpusManifest.model_validate_json((root / "manifest.json").read_text())
    except (OSError, ValidationError) as exc:
        raise InvalidRequest(f"no usable corpus manifest at {root}: {exc}") from exc

    def plan(task: SweTask) -> dict[str, Any]:
        try:
            validate_tasks([task])  # a corpus plan needs a complete task (the fix, the tests, the workdir)
            doc = plan_for_task(manifest, task, harness=harness)
        except InvalidRequest as exc:
            raise PlanInvalid(f"{task.instance_id}: not a task of the corpus at {root}: {exc}") from exc
        doc.setdefault("resources", dict(DEMO_TEMPLATE["resources"]))
        doc.setdefault("timeout", DEMO_TEMPLATE["timeout"])
        ev = doc["evaluator"]
        task_file = root / "evaluator" / EVAL_DIR.lstrip("/") / "tasks" / f"{task.instance_id}.json"
        if not task_file.is_file():
            ev["command"] = SCORE_COMMAND
        ev["env"] = {**ev.get("env", {}), "RS_TASK": json.dumps(task.score_document(), separators=(",", ":")),
                     "RS_TEST_COMMAND": task.test_command or ""}
        return doc

    return plan
