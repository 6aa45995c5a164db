"""Published-plan references: which strings name a template, how the SDK sends them."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollstack.client._base import plan_to_wire
from rollstack.errors import PlanInvalid
from rollstack.plan.model import load_plan
from rollstack.plan.published import is_plan_ref, plan_document


@pytest.mark.parametrize("text", ["tasks/app:1", "base", "my-template:latest", "a/b/c:v1.2"])
def test_names_are_refs(text, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert is_plan_ref(text)
    assert plan_to_wire(text) == text  # the node resolves it from its store


@pytest.mark.parametrize("text", ["", "  ", "plan.yaml", "dir/plan.yml", "p.json", "Has Spaces", "UPPER:1", 7, None])
def test_non_refs(text, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert not is_plan_ref(text)


def test_an_existing_file_wins_over_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("base").write_text("groups: [os/busybox:1]\nname: from-file\n")
    assert not is_plan_ref("base")
    assert plan_to_wire("base")["name"] == "from-file"
    with pytest.raises(PlanInvalid):
        plan_to_wire("missing.yaml")  # a missing plan file stays a plan file error


def test_plan_document_is_self_contained(tmp_path):
    (tmp_path / "t.diff").write_text("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    (tmp_path / "p.yaml").write_text("groups: [os/busybox:1]\nmutation: t.diff\n")
    doc = plan_document(load_plan(tmp_path / "p.yaml"))
    assert "mutation" not in doc and doc["mutation_text"].startswith("--- a/x")
    assert load_plan(doc).mutation_text == doc["mutation_text"]
