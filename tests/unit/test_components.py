"""tests/components.py: a missing component skips on a developer's machine and fails in CI."""

from __future__ import annotations

import pytest

from components import in_ci, need, require_tool


@pytest.mark.parametrize("value, ci", [("true", True), ("1", True), ("yes", True), ("", False), ("false", False),
                                       ("0", False)])
def test_ci_is_any_value_but_an_explicit_no(monkeypatch, value: str, ci: bool) -> None:
    monkeypatch.setenv("CI", value)
    assert in_ci() is ci


def test_missing_component_skips_without_ci(monkeypatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="frobnicator missing"):
        need(False, "frobnicator")
    need(True, "frobnicator")  # present: nothing happens


def test_missing_component_fails_in_ci(monkeypatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI is missing no-such-tool-rs"):
        require_tool("sh", "no-such-tool-rs")
    require_tool("sh", "/bin/sh")
