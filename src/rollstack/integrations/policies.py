"""Policies for the GRPO rollout driver: what a rollout does inside its environment.

A policy is any object with `name` and
`async rollout(env, task, rng) -> list[dict]` (one record per step: `command`, `exit_code`). `env`
is an `AsyncEnvironment` (or anything with async `exec` / `write_file`); the driver scores the
result with the plan's evaluator afterwards, so a policy never reports its own reward.

- `ScriptedPolicy`: run the failing tests, apply the reference `fix` (`git apply`, falling back to
  `patch -p1`), rerun them. Reward 1.0 on a sound task.
- `RandomPolicy`: like the scripted one, but applies the fix only with probability `p_fix`, so
  rewards vary inside a group (what GRPO needs to learn anything).
"""

from __future__ import annotations

import random
from typing import Any, Protocol

from rollstack.integrations.tasks import SweTask

FIX_PATH = "/tmp/rollstack-fix.diff"
APPLY_FIX = f"git apply --whitespace=nowarn {FIX_PATH} 2>/dev/null || patch -p1 -N < {FIX_PATH}"


class Policy(Protocol):
    name: str

    async def rollout(self, env: Any, task: SweTask, rng: random.Random) -> list[dict[str, Any]]: ...


async def _run(env: Any, steps: list[dict[str, Any]], command: str, timeout: float) -> Any:
    result = await env.exec(command, timeout=timeout)
    steps.append({"command": command, "exit_code": result.exit_code, "timed_out": result.timed_out})
    return result


class ScriptedPolicy:
    name = "scripted"

    def __init__(self, step_timeout: float = 600.0) -> None:
        self.step_timeout = step_timeout

    async def rollout(self, env: Any, task: SweTask, rng: random.Random) -> list[dict[str, Any]]:
        steps: list[dict[str, Any]] = []
        if task.test_command:
            await _run(env, steps, task.test_command, self.step_timeout)
        if self.decide(rng) and task.fix:
            await env.write_file(FIX_PATH, task.fix.encode())
            await _run(env, steps, APPLY_FIX, self.step_timeout)
        if task.test_command:
            await _run(env, steps, task.test_command, self.step_timeout)
        return steps

    def decide(self, rng: random.Random) -> bool:
        """Whether this rollout applies the fix."""
        return True


class RandomPolicy(ScriptedPolicy):
    name = "random"

    def __init__(self, p_fix: float = 0.5, step_timeout: float = 600.0) -> None:
        super().__init__(step_timeout)
        if not 0.0 <= p_fix <= 1.0:
            raise ValueError("p_fix must be within [0, 1]")
        self.p_fix = p_fix

    def decide(self, rng: random.Random) -> bool:
        return rng.random() < self.p_fix


def make_policy(name: str, *, p_fix: float = 0.5, step_timeout: float = 600.0) -> Policy:
    """A policy by name (`scripted`, `random`) or by dotted path `module:Class` / `module.Class`."""
    if name == "scripted":
        return ScriptedPolicy(step_timeout)
    if name == "random":
        return RandomPolicy(p_fix, step_timeout)
    import importlib

    module, _, attr = name.replace(":", ".").rpartition(".")
    if not module:
        raise ValueError(f"unknown policy {name!r} (scripted, random, or module.Class)")
    return getattr(importlib.import_module(module), attr)()
