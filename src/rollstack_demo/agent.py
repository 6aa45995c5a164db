"""One rollout with a scripted agent, through the SDK (`Node`/`Client`: the same interface).

create (the task's bug applied at init) -> run the failing tests (they must fail) -> apply the
reference fix with `git apply` inside the environment -> run them again (they must pass) ->
`evaluate()` (a clean evaluator environment scores the rollout's diff) -> destroy. Every step is
timed; a failure is recorded as `code: message` and the environment is destroyed anyway.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

from rollstack.tasks.plans import FIX_ARGV, StackGroups, TaskLike, as_task, failing_tests_command, rollout_plan
from rollstack_demo.report import RolloutRecord, StepResult
from rollstack.errors import InsufficientCapacity, RollstackError

CAPACITY_WAIT = 120.0
"""Seconds a create/evaluate keeps retrying `insufficient_capacity` (what an RL driver should do:
the node refuses at once instead of queueing, and capacity frees up as neighbours finish)."""

_DIFF_FILE = re.compile(r"^diff --git ", re.MULTILINE)


class Cancelled(Exception):
    """The run is being stopped (Ctrl-C): no new step starts."""


def _check(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled()


def _with_capacity(fn: Any, rec: RolloutRecord, cancel: threading.Event | None) -> Any:
    """`fn()`, retried with backoff while the node answers insufficient_capacity."""
    deadline = time.monotonic() + CAPACITY_WAIT
    delay = 0.25
    while True:
        _check(cancel)
        try:
            return fn()
        except InsufficientCapacity:
            if time.monotonic() + delay > deadline:
                raise
            rec.capacity_retries += 1
            time.sleep(delay)
            delay = min(delay * 2, 4.0)


def _step(env: Any, command: str | list[str], timeout: float, stdin: str | None = None) -> tuple[StepResult, Any]:
    r = env.exec(command, timeout=timeout, stdin=stdin)
    return StepResult(exit_code=r.exit_code, seconds=round(r.duration, 4), timed_out=r.timed_out), r


def run_rollout(node: Any, task: TaskLike, groups: StackGroups, rollout: int, *,
                exec_timeout: float = 300.0, cancel: threading.Event | None = None,
                apply_fix: bool = True, background_fill: bool = False) -> RolloutRecord:
    """Run one rollout of `task` on `node`; never raises for a rollout's own failure.

    `apply_fix=False` is the control: an agent that changes nothing (its reward must be 0.0)."""
    task = as_task(task)
    rec = RolloutRecord(task=task.instance_id, rollout=rollout)
    t_start = time.perf_counter()
    env = None
    try:
        _check(cancel)
        plan = rollout_plan(task, groups, rollout, background_fill=background_fill)
        env = _with_capacity(lambda: node.create(plan), rec, cancel)
        rec.env_id = env.id
        created = env.created
        rec.timings = {k: float(v) for k, v in created.timings.model_dump().items()
                       if isinstance(v, (int, float))}
        rec.fetch = {k: int(v) for k, v in created.fetch.model_dump().items() if isinstance(v, (int, float))}

        _check(cancel)
        rec.test_before, _ = _step(env, failing_tests_command(task), exec_timeout)
        _check(cancel)
        if apply_fix:
            rec.fix, fix_out = _step(env, FIX_ARGV, 60.0, stdin=task.fix)
            if rec.fix.exit_code != 0:
                rec.error = f"fix_failed: git apply exited {rec.fix.exit_code}: {(fix_out.stderr or '').strip()[-200:]}"
        _check(cancel)
        rec.test_after, _ = _step(env, failing_tests_command(task), exec_timeout)
        _check(cancel)
        rec.diff_files = len(_DIFF_FILE.findall(env.diff()))
        _check(cancel)
        ev = _with_capacity(env.evaluate, rec, cancel)
        rec.reward = float(ev.reward)
        rec.eval_seconds = round(float(ev.timings.get("total", 0.0)), 4)
        rec.eval_run_seconds = round(float(ev.timings.get("run", 0.0)), 4)
    except Cancelled:
        rec.error = rec.error or "cancelled: the demo was interrupted"
    except RollstackError as exc:
        rec.error = rec.error or f"{exc.code}: {exc.message or exc.code}"
    except Exception as exc:  # noqa: BLE001 - a bug below the SDK: recorded, and the run exits non-zero
        rec.error = rec.error or f"internal_error: {type(exc).__name__}: {exc}"
    finally:
        if env is not None:
            t = time.perf_counter()
            try:
                env.destroy()
                rec.destroy_seconds = round(time.perf_counter() - t, 4)
            except Exception as exc:  # noqa: BLE001 - recorded; the leftover check will say what stayed
                rec.error = rec.error or f"destroy_failed: {exc}"
        rec.wall_seconds = round(time.perf_counter() - t_start, 4)
    return rec
