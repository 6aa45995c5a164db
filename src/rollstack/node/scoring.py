"""Evaluation, the pure part: the evaluator environment's plan, and the reward from its outcome.

The evaluator runs in a fresh clean environment built from `plan.evaluator` (its own groups,
workdir, env) with the rollout's diff applied as its mutation. The rollout's diff names paths
relative to the environment root, so the evaluator plan's workdir is `/` (where the mutation is
applied) and its command runs with cwd = the evaluator's workdir (`evaluator_cwd`).
"""

from __future__ import annotations

from typing import Any

from rollstack.errors import InvalidRequest

MUTATION_WORKDIR = "/"
"""Where the rollout diff's paths start (upper_diff names paths from the root)."""


def evaluator_plan(plan: Any, rollout_diff: str) -> Any:
    """The `Plan` of the clean environment that scores a rollout of `plan`."""
    from rollstack.plan.model import Plan

    ev = plan.evaluator
    if ev is None:
        raise InvalidRequest(f"plan {plan.name!r} has no evaluator")
    env = dict(plan.env)
    env.update(ev.env)
    return Plan(
        name=f"{plan.name}-evaluator",
        groups=list(ev.groups),
        mutation_text=rollout_diff or None,
        workdir=MUTATION_WORKDIR,
        env=env,
        resources=plan.resources,
        runtime=getattr(plan, "runtime", "runc"),  # the rollout's code runs in the same tier
        security=plan.security,
        fetch=plan.fetch,
        timeout=max(ev.timeout + 60.0, 120.0),
    )


def reward_from(evaluator: Any, exit_code: int, reward_file: bytes | None) -> float:
    """1.0 iff the command exited 0 (reward: exit_code), or the number in the reward file."""
    if evaluator.reward == "exit_code":
        return 1.0 if exit_code == 0 else 0.0
    if reward_file is None:
        return 0.0
    try:
        return float(reward_file.decode("utf-8", "replace").strip().split()[0])
    except (ValueError, IndexError):
        return 0.0


def reward_file_path(evaluator: Any, workdir: str) -> str | None:
    """The absolute in-environment path of the reward file (None unless reward: file)."""
    if evaluator.reward != "file" or not evaluator.reward_file:
        return None
    path = evaluator.reward_file
    return path if path.startswith("/") else f"{workdir.rstrip('/')}/{path}"
