"""Pure parts of the node: evaluator plans, rewards, exec streaming, request models."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollstack.errors import InvalidRequest
from rollstack.node.execution import stream, to_wire
from rollstack.contract.models import ExecRequest
from rollstack.node.scoring import evaluator_plan, reward_file_path, reward_from
from rollstack.plan.model import load_plan

PLAN = {
    "name": "t",
    "groups": ["os/a:1", "repo/b:1"],
    "workdir": "/work/b",
    "env": {"A": "1", "B": "plan"},
    "resources": {"cpu": 0.5, "memory": "64Mi"},
    "evaluator": {"groups": ["os/a:1", "eval/c:1"], "command": "pytest -q", "env": {"B": "eval"}, "timeout": 30},
}


def test_evaluator_plan_applies_the_diff_at_root_with_merged_env() -> None:
    plan = load_plan(PLAN)
    ev = evaluator_plan(plan, "--- a/x\n+++ b/x\n")
    assert ev.groups == ["os/a:1", "eval/c:1"]
    assert ev.mutation_text == "--- a/x\n+++ b/x\n" and ev.workdir == "/"
    assert ev.env == {"A": "1", "B": "eval"}
    assert ev.resources == plan.resources and ev.evaluator is None
    assert ev.timeout >= 30
    assert evaluator_plan(plan, "").mutation_text is None


def test_a_plan_without_evaluator_cannot_be_evaluated() -> None:
    with pytest.raises(InvalidRequest):
        evaluator_plan(load_plan({"groups": ["os/a:1"]}), "")


@given(st.integers(min_value=-255, max_value=255))
def test_exit_code_reward_is_one_iff_zero(code: int) -> None:
    ev = SimpleNamespace(reward="exit_code", reward_file=None)
    assert reward_from(ev, code, None) == (1.0 if code == 0 else 0.0)


@pytest.mark.parametrize("data,expected", [(b"0.75\n", 0.75), (b"1", 1.0), (b" 2.5 extra", 2.5), (b"nan?", 0.0), (b"", 0.0), (None, 0.0)])
def test_file_reward(data: bytes | None, expected: float) -> None:
    ev = SimpleNamespace(reward="file", reward_file="out/reward.txt")
    assert reward_from(ev, 1, data) == expected
    assert reward_file_path(ev, "/work/b") == "/work/b/out/reward.txt"
    assert reward_file_path(SimpleNamespace(reward="file", reward_file="/r"), "/w") == "/r"
    assert reward_file_path(SimpleNamespace(reward="exit_code", reward_file=None), "/w") is None


@given(st.text(min_size=0, max_size=200), st.integers(min_value=1, max_value=7))
def test_stream_decodes_utf8_split_anywhere(text: str, step: int) -> None:
    raw = text.encode()

    def run(on_output):
        for i in range(0, len(raw), step):
            on_output("stdout", raw[i:i + step])
        return SimpleNamespace(exit_code=0, stdout=raw, stderr=b"", duration=0.1, timed_out=False, truncated=False)

    chunks = list(stream(run, to_wire))
    assert "".join(c.data or "" for c in chunks if c.type == "stdout") == text
    assert chunks[-1].type == "result" and chunks[-1].result.stdout == text


def test_stream_reraises_the_exec_error() -> None:
    def run(on_output):
        on_output("stderr", b"partial")
        raise InvalidRequest("bad")

    it = stream(run, to_wire)
    assert next(it).data == "partial"
    with pytest.raises(InvalidRequest):
        next(it)


def test_exec_request_forms() -> None:
    assert ExecRequest(command="ls -l").resolved_argv() == ["/bin/sh", "-c", "ls -l"]
    assert ExecRequest(argv=["ls", "-l"]).resolved_argv() == ["ls", "-l"]
    for bad in ({}, {"argv": []}, {"argv": ["a"], "command": "b"}):
        with pytest.raises(ValueError):
            ExecRequest(**bad)
