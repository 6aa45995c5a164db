"""The demo's configuration and its preconditions (rollstack_demo)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollstack.errors import InvalidRequest
from rollstack_demo.config import DemoConfig


@pytest.mark.parametrize("field,value", [("tasks", 0), ("rollouts", -1), ("concurrency", 0), ("concurrency", 65),
                                         ("tasks", 1.5)])
def test_config_rejects_bad_counts(field: str, value: object) -> None:
    with pytest.raises(InvalidRequest):
        DemoConfig(**{field: value})


def test_config_paths() -> None:
    c = DemoConfig(root=Path("/r"))
    assert c.node_root == Path("/r/node") and c.publish_cache == Path("/r/published.json")
    assert DemoConfig(root=Path("/r"), node_dir=Path("/n")).node_root == Path("/n")


def test_the_demo_refuses_to_run_without_root(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollstack_demo import runner

    monkeypatch.setattr(runner.os, "geteuid", lambda: 1000)
    with pytest.raises(InvalidRequest, match="needs root"):
        runner.run_demo(DemoConfig())
