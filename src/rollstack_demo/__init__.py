"""The demo (`rollstack demo`, `make demo`): rollstack's main job, end to end, on one machine.

corpus (built once, cached) -> publish its groups to the store (cached) -> an in-process node ->
N tasks x M rollouts (create with the task's bug, a scripted agent runs the failing test, applies
the reference fix, reruns, the rollout is scored in a clean evaluator environment, destroyed) ->
a table of per-phase init timings, bytes fetched vs stack size, exec times and rewards.

Modules: `config` (the value object), `agent` (one scripted rollout), `report` (pure: records ->
summary/table/JSON), `runner` (strings it together, cleans up on every exit). The corpus it builds
and publishes is `rollstack_corpus`'s, its plans `rollstack.tasks.plans`. A package beside the
product (`make setup` installs it; `rollstack demo` loads it): the runtime carries no fixtures.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DemoConfig", "run_demo"]


def __getattr__(name: str) -> Any:
    if name == "DemoConfig":
        from rollstack_demo.config import DemoConfig

        return DemoConfig
    if name == "run_demo":
        from rollstack_demo.runner import run_demo

        return run_demo
    raise AttributeError(f"module 'rollstack_demo' has no attribute {name!r}")
