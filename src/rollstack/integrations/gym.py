"""A gymnasium-like text environment over rollstack: action = a shell command, reward = the
plan's evaluator.

    env = RolloutEnv(tasks=load_tasks("tasks.jsonl"))        # or RolloutEnv(client, ...)
    obs, info = env.reset(seed=0)                            # a fresh environment: plan + mutation
    obs, reward, terminated, truncated, info = env.step("python3 -m pytest -q")
    ...
    obs, reward, terminated, truncated, info = env.step("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
    env.close()

An episode ends (terminated) on a submit action: the action is exactly the marker, or its output's
first line is the marker and it exited 0 (mini-swe-agent's rule); the reward is then
`env.evaluate().reward`. It is truncated on the step or time limit (scored too, unless
`evaluate_on_truncation` is off) or when the environment dies (`oom_terminated`,
`environment_gone`: reward 0, `info["error"]` says which, so an RL loop can drop or resample the
sample). Every other step has reward 0. The rollstack environment is destroyed as soon as the
episode ends (capacity goes back to the node), by `reset()` and by `close()`.

A task given to `reset()` is a `SweTask`/SWE-smith record (planned with `plan_template`), a plan
dict (with `groups`), or a plan file path; `reset()` without one picks from `tasks` (seeded).
`AsyncRolloutEnv` is the same over `AsyncClient`, with `await`.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any, Sequence

from pydantic import BaseModel, ConfigDict

from rollstack.errors import ExecTimeout, InvalidRequest, RollstackError
from rollstack.integrations.connect import async_client, sync_client
from rollstack.integrations.episode import (
    SUBMIT_MARKER,
    EpisodeLimits,
    EpisodeState,
    merged_output,
    shell_argv,
    submission_of,
)
from rollstack.integrations.tasks import SweTask, task_plan

EPISODE_ENDING = ("oom_terminated", "environment_gone", "environment_not_found")


class RolloutConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_steps: int = 50
    """Actions per episode before truncation (0: no limit)."""
    max_seconds: float = 0.0
    """Wall-clock seconds per episode before truncation (0: no limit)."""
    step_timeout: float = 60.0
    """Seconds one command may run (capped by what is left of max_seconds)."""
    submit_marker: str = SUBMIT_MARKER
    evaluate_on_truncation: bool = True
    merge_stderr: bool = True
    cwd: str | None = None
    """Working directory of commands (default: the plan's workdir)."""
    env: dict[str, str] = {}
    max_observation_chars: int = 20_000
    """Longer outputs keep their head and tail around an elision note."""
    plan_template: dict[str, Any] | None = None
    """For SWE-smith tasks (None: the demo corpus's template)."""


def task_to_plan(task: Any, template: dict[str, Any] | None) -> tuple[Any, str, str | None]:
    """(plan, prompt, task id) for anything `reset()` accepts."""
    if isinstance(task, SweTask):
        return task_plan(task, template), task.prompt(), task.instance_id
    if isinstance(task, dict) and "instance_id" in task and "groups" not in task:
        t = SweTask.model_validate(task)
        return task_plan(t, template), t.prompt(), t.instance_id
    if isinstance(task, dict):
        name = str(task.get("name", "task"))
        return task, f"Environment for {name} is ready (workdir {task.get('workdir', '/')}).", name
    if isinstance(task, (str, Path)):
        return str(task), f"Environment for {Path(task).stem} is ready.", Path(task).stem
    raise InvalidRequest(f"a task is a SWE-smith record, a plan dict or a plan path, not {type(task).__name__}")


def clip(text: str, limit: int) -> str:
    if limit <= 0 or len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters elided ...]\n{text[-half:]}"


class _Episodes:
    """What both variants share: task choice, observation and episode-end decisions (no I/O)."""

    def __init__(self, tasks: Sequence[Any], config: RolloutConfig | None, overrides: dict[str, Any]) -> None:
        base = config.model_dump() if config is not None else {}
        self.config = RolloutConfig(**(base | overrides))
        self.tasks = list(tasks)
        self._rng = random.Random()
        self.state: EpisodeState | None = None
        self.task_id: str | None = None
        self.env: Any = None

    def _pick(self, task: Any, seed: int | None) -> Any:
        if seed is not None:
            self._rng = random.Random(seed)
        if task is not None:
            return task
        if not self.tasks:
            raise InvalidRequest("reset() needs a task (none given, and the environment has no task list)")
        return self._rng.choice(self.tasks)

    def _begin(self, created: Any, prompt: str, task_id: str | None) -> tuple[str, dict[str, Any]]:
        self.state = EpisodeState(EpisodeLimits(self.config.max_steps, self.config.max_seconds))
        self.task_id = task_id
        info: dict[str, Any] = {"environment_id": self.env.id, "task_id": task_id}
        if created is not None:
            info["timings"] = created.timings.model_dump()
            info["fetch"] = created.fetch.model_dump()
        return prompt, info

    def _check_running(self) -> EpisodeState:
        if self.state is None or self.state.done or self.env is None:
            raise InvalidRequest("the episode is over (or never started): call reset()")
        return self.state

    def _command(self, action: str) -> tuple[Any, float]:
        state = self._check_running()
        state.steps += 1
        timeout = self.config.step_timeout
        left = state.remaining_seconds()
        if left is not None:
            timeout = min(timeout, left)
        return shell_argv(action, [], self.config.merge_stderr), timeout

    def _observe(self, result: Any, timeout: float) -> tuple[str, dict[str, Any], str | None]:
        text = merged_output(result.stdout, result.stderr)
        submission = None if result.timed_out else submission_of(text, result.exit_code, self.config.submit_marker)
        obs = text + (f"\n[command timed out after {timeout:g}s]" if result.timed_out else "")
        info = {"returncode": result.exit_code, "timed_out": result.timed_out, "duration": result.duration}
        return clip(obs, self.config.max_observation_chars), info, submission

    def _ending(self, submitted: bool) -> str | None:
        """'submitted' / 'step_limit' / 'time_limit' when the episode ends after this step."""
        assert self.state is not None
        if submitted:
            return "submitted"
        return self.state.out_of_budget()

    def _wants_score(self, ending: str) -> bool:
        return ending == "submitted" or self.config.evaluate_on_truncation


class RolloutEnv(_Episodes):
    def __init__(
        self,
        client: Any = None,
        *,
        tasks: Sequence[Any] = (),
        node: str | None = None,
        token: str | None = None,
        config: RolloutConfig | None = None,
        **overrides: Any,
    ) -> None:
        """`client`: a `Client` or in-process `Node` (else one is built from node/token and owned).
        Keyword overrides set `RolloutConfig` fields."""
        super().__init__(tasks, config, overrides)
        self.client, self._owns = sync_client(client, node, token)

    def reset(self, task: Any = None, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict[str, Any]]:
        self._destroy()
        plan, prompt, task_id = task_to_plan(self._pick(task, seed), self.config.plan_template)
        self.env = self.client.create(plan)
        return self._begin(getattr(self.env, "created", None), prompt, task_id)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        command, timeout = self._command(action)
        if action.strip() == self.config.submit_marker:
            return self._finish("submitted", "", {"submission": ""})
        t0 = time.monotonic()
        try:
            result = self.env.exec(command, timeout=timeout, cwd=self.config.cwd, env=self.config.env or None)
        except ExecTimeout:
            result = _timed_out(timeout)
        except RollstackError as exc:
            if exc.code not in EPISODE_ENDING:
                raise
            return self._died(exc)
        finally:
            self.state.exec_seconds += time.monotonic() - t0  # type: ignore[union-attr]
        obs, info, submission = self._observe(result, timeout)
        if submission is not None:
            info["submission"] = submission
        ending = self._ending(submission is not None)
        if ending is None:
            return obs, 0.0, False, False, info
        return self._finish(ending, obs, info)

    def truncate(self, ending: str = "step_limit") -> tuple[str, float, bool, bool, dict[str, Any]]:
        """End the running episode now, as a truncation (scored unless `evaluate_on_truncation`
        is off): for a caller that counts turns of its own, e.g. model outputs without a command."""
        self._check_running()
        return self._finish(ending, "", {})

    def _finish(self, ending: str, obs: str, info: dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        assert self.state is not None
        self.state.done = True
        reward = 0.0
        info |= {"ending": ending, "steps": self.state.steps, "exec_seconds": self.state.exec_seconds}
        try:
            if self._wants_score(ending):
                t0 = time.monotonic()
                evaluation = self.env.evaluate()
                info["evaluation"] = evaluation.model_dump()
                info["eval_seconds"] = time.monotonic() - t0
                reward = float(evaluation.reward)
        finally:
            self._destroy()
        return obs, reward, ending == "submitted", ending != "submitted", info

    def _died(self, exc: RollstackError) -> tuple[str, float, bool, bool, dict[str, Any]]:
        assert self.state is not None
        self.state.done = True
        info = {"ending": "error", "error": exc.code, "message": str(exc), "steps": self.state.steps}
        self._destroy()
        return f"[environment ended: {exc.code}: {exc}]", 0.0, False, True, info

    def _destroy(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            try:
                env.destroy()
            except RollstackError:
                pass  # already gone: destroying is best effort at episode end

    def close(self) -> None:
        self._destroy()
        if self._owns:
            self._owns = False
            self.client.close()

    def __enter__(self) -> "RolloutEnv":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRolloutEnv(_Episodes):
    """`RolloutEnv` over `AsyncClient`: `await reset(...)`, `await step(...)`, `await close()`."""

    def __init__(
        self,
        client: Any = None,
        *,
        tasks: Sequence[Any] = (),
        node: str | None = None,
        token: str | None = None,
        config: RolloutConfig | None = None,
        **overrides: Any,
    ) -> None:
        super().__init__(tasks, config, overrides)
        self.client, self._owns = async_client(client, node, token)

    async def reset(self, task: Any = None, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict[str, Any]]:
        await self._destroy()
        plan, prompt, task_id = task_to_plan(self._pick(task, seed), self.config.plan_template)
        self.env = await self.client.create(plan)
        return self._begin(getattr(self.env, "created", None), prompt, task_id)

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        command, timeout = self._command(action)
        if action.strip() == self.config.submit_marker:
            return await self._finish("submitted", "", {"submission": ""})
        t0 = time.monotonic()
        try:
            result = await self.env.exec(command, timeout=timeout, cwd=self.config.cwd, env=self.config.env or None)
        except ExecTimeout:
            result = _timed_out(timeout)
        except RollstackError as exc:
            if exc.code not in EPISODE_ENDING:
                raise
            return await self._died(exc)
        finally:
            self.state.exec_seconds += time.monotonic() - t0  # type: ignore[union-attr]
        obs, info, submission = self._observe(result, timeout)
        if submission is not None:
            info["submission"] = submission
        ending = self._ending(submission is not None)
        if ending is None:
            return obs, 0.0, False, False, info
        return await self._finish(ending, obs, info)

    async def _finish(self, ending: str, obs: str, info: dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        assert self.state is not None
        self.state.done = True
        reward = 0.0
        info |= {"ending": ending, "steps": self.state.steps, "exec_seconds": self.state.exec_seconds}
        try:
            if self._wants_score(ending):
                t0 = time.monotonic()
                evaluation = await self.env.evaluate()
                info["evaluation"] = evaluation.model_dump()
                info["eval_seconds"] = time.monotonic() - t0
                reward = float(evaluation.reward)
        finally:
            await self._destroy()
        return obs, reward, ending == "submitted", ending != "submitted", info

    async def _died(self, exc: RollstackError) -> tuple[str, float, bool, bool, dict[str, Any]]:
        assert self.state is not None
        self.state.done = True
        info = {"ending": "error", "error": exc.code, "message": str(exc), "steps": self.state.steps}
        await self._destroy()
        return f"[environment ended: {exc.code}: {exc}]", 0.0, False, True, info

    async def _destroy(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            try:
                await env.destroy()
            except RollstackError:
                pass

    async def close(self) -> None:
        await self._destroy()
        if self._owns:
            self._owns = False
            await self.client.aclose()

    async def __aenter__(self) -> "AsyncRolloutEnv":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _timed_out(timeout: float) -> Any:
    from rollstack.contract.models import ExecResult

    return ExecResult(exit_code=-1, timed_out=True, duration=timeout)
