"""`Stages` answers "not provisioned" for an unknown environment, and lets every other
provisioner failure through (it used to turn any exception into an empty history)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollstack.errors import EnvironmentNotFound
from rollstack.node.config import NodeConfig
from rollstack.node.stages import Stages


class _Provisioner:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def history(self, env_id: str):
        raise self.error

    events = quotas = history


def _stages(tmp_path: Path, error: Exception) -> Stages:
    s = Stages(NodeConfig(root=tmp_path))
    s.provisioner = _Provisioner(error)  # type: ignore[assignment]
    return s


def test_unknown_environment_has_no_history_or_quotas(tmp_path: Path) -> None:
    s = _stages(tmp_path, EnvironmentNotFound("not provisioned", env="e1"))
    assert s.history("e1") == ([], []) and s.quotas("e1") is None


def test_a_provisioner_failure_is_not_swallowed(tmp_path: Path) -> None:
    s = _stages(tmp_path, RuntimeError("sampling thread died"))
    with pytest.raises(RuntimeError, match="sampling thread died"):
        s.history("e1")
    with pytest.raises(RuntimeError):
        s.quotas("e1")
