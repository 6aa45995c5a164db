"""Plan parsing and validation: good plans load, bad ones name the field and the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from rollstack.errors import InvalidRequest, PlanInvalid
from rollstack.core.units import GiB as GIB
from rollstack.plan.model import Plan, load_plan
from rollstack.plan.refs import GroupRef

EXAMPLE = """
name: attrs-task-0042
groups:
  - os/debian-python:bookworm
  - repo/attrs:23.2.0
  - harness/mini-swe-agent:2.4
mutation: task-0042.diff
workdir: /work/attrs
env: {PYTHONDONTWRITEBYTECODE: "1", N: 3}
resources: {cpu: 0.5, memory: 256Mi, max_cpu: 64, max_memory: 32Gi}
network: none
fetch: {background: true}
timeout: 1800
evaluator:
  groups: [os/debian-python:bookworm, repo/attrs:23.2.0, evaluator/attrs-tests:1]
  command: ["python3", "-m", "pytest", "-q", "tests/test_funcs.py"]
  reward: exit_code
"""


def test_interface_example_loads_and_resolves_mutation(tmp_path: Path):
    (tmp_path / "task-0042.diff").write_text("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    (tmp_path / "plan.yaml").write_text(EXAMPLE)
    plan = load_plan(tmp_path / "plan.yaml")
    assert plan.groups[1] == "repo/attrs:23.2.0"
    assert plan.resources.memory == 256 * 2**20 and plan.resources.max_memory == 32 * GIB
    assert plan.env == {"PYTHONDONTWRITEBYTECODE": "1", "N": "3"}
    assert plan.mutation_text.startswith("--- a/x")
    assert plan.evaluator.argv[0] == "python3" and plan.evaluator_workdir == "/work/attrs"
    # round trip through JSON (how the SDK sends it to the node) keeps the diff inline
    again = load_plan(json.loads(plan.model_dump_json()))
    assert again == plan


def test_defaults():
    plan = load_plan({"groups": ["os/base:1"]})
    assert plan.resources.max_cpu == 64 and plan.resources.max_memory == 32 * GIB
    assert plan.network == "none" and plan.fetch.background and not plan.fetch.eager
    assert plan.workdir == "/" and plan.mutation_text is None


def test_inline_mutation_and_string_command():
    diff = "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n"
    plan = load_plan({"groups": ["a:1"], "mutation": diff,
                      "evaluator": {"groups": ["a:1"], "command": "pytest -q", "reward": "file",
                                    "reward_file": "/tmp/reward"}})
    assert plan.mutation_text == diff
    assert plan.evaluator.argv == ["/bin/sh", "-c", "pytest -q"]


@pytest.mark.parametrize("doc, field, reason", [
    ({"groups": ["a:1"], "resources": {"memory": "12Qi"}}, "resources.memory", "'12Qi' is not a size"),
    ({"groups": ["a:1"], "bogus": 1}, "bogus", "unknown field"),
    ({"groups": ["a:1"], "resources": {"gpu": 1}}, "resources.gpu", "unknown field"),
    ({"groups": []}, "groups", "at least one group"),
    ({}, "groups", "required"),
    ({"groups": ["Bad Name:1"]}, "groups", "not a valid group name"),
    ({"groups": ["a:1"], "network": "host"}, "network", "not a network mode"),
    ({"groups": ["a:1"], "workdir": "rel"}, "workdir", "absolute"),
    ({"groups": ["a:1"], "resources": {"cpu": 100}}, "resources", "above max_cpu"),
    ({"groups": ["a:1"], "timeout": -1}, "timeout", "greater than 0"),
    ({"groups": ["a:1"], "evaluator": {"groups": ["a:1"], "command": "x", "reward": "file"}}, "evaluator", "reward_file"),
    ({"groups": ["a:1"], "evaluator": {"groups": ["a:1"], "command": "x", "reward": "vibes"}}, "evaluator.reward", "exit_code"),
    ({"groups": ["a:1"], "evaluator": {"command": "x"}}, "evaluator.groups", "required"),
    ({"groups": ["a:1"], "mutation": "no-such.diff"}, "mutation", "cannot read"),
])
def test_invalid_plans_name_field_and_reason(doc, field, reason):
    with pytest.raises(PlanInvalid) as info:
        load_plan(doc, base_dir=Path("/nonexistent"))
    assert info.value.code == "plan_invalid"
    assert info.value.message.startswith(field + ":") and reason in info.value.message


def test_bad_files(tmp_path: Path):
    with pytest.raises(PlanInvalid, match="does not exist"):
        load_plan(tmp_path / "nope.yaml")
    (tmp_path / "p.yaml").write_text("groups: [a\n")
    with pytest.raises(PlanInvalid, match="not valid YAML"):
        load_plan(tmp_path / "p.yaml")
    (tmp_path / "p.json").write_text("[1]")
    with pytest.raises(PlanInvalid, match="mapping"):
        load_plan(str(tmp_path / "p.json"))


def test_group_refs():
    assert GroupRef.parse("repo/attrs:23.2.0") == GroupRef("repo/attrs", "23.2.0")
    digest = "sha256:" + "a" * 64
    ref = GroupRef.parse(f"repo/attrs@{digest}")
    assert ref.pinned and ref.ref == digest and str(ref) == f"repo/attrs@{digest}"
    assert GroupRef.parse("base").tag == "latest"
    for bad in ["", "Repo/x:1", "a:b:c", "a@sha256:12", "a/:1", "a:-x"]:
        with pytest.raises(InvalidRequest):
            GroupRef.parse(bad)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**12) | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=6)
    | st.sampled_from(["256Mi", "a:1", "/w", "none", "file", "exit_code"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(
        st.sampled_from(["groups", "cpu", "memory", "command", "reward", "env", "x", "background"]), children, max_size=3),
    max_leaves=8,
)
FIELDS = ["name", "groups", "mutation", "mutation_text", "workdir", "env", "resources", "network", "fetch",
          "timeout", "evaluator", "bogus"]


@given(st.dictionaries(st.sampled_from(FIELDS), JSONISH, max_size=6))
def test_any_document_is_a_plan_or_plan_invalid(doc):
    try:
        plan = load_plan(doc, base_dir=Path("/nonexistent"))
    except PlanInvalid as exc:
        assert exc.message
    else:
        assert isinstance(plan, Plan) and plan.groups
