"""Published plans (templates) on real stores, the OCI layout and a real docker-registry (the
shared `store` fixture): publish with the mutation diff and evaluator inline, republish (nothing
uploaded), list, load back, and the CLI (`plan publish`, `plan ls`) with its error line."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml

from rollstack.cli.main import main
from rollstack.errors import PlanInvalid, TemplateNotFound
from rollstack.plan.groups import list_groups, publish_group
from rollstack.plan.published import PLAN_ARTIFACT_TYPE, list_plans, load_published, publish_plan

pytestmark = pytest.mark.integration

DIFF = "--- a/hello.txt\n+++ b/hello.txt\n@@ -1 +1 @@\n-hello\n+bug\n"


def plan_file(tmp_path: Path, **extra) -> Path:
    (tmp_path / "task.diff").write_text(DIFF)
    doc = {"name": "task-7", "groups": ["os/busybox:1", "repo/app:1"], "mutation": "task.diff",
           "workdir": "/work/app", "evaluator": {"groups": ["os/busybox:1"], "command": "true"}, **extra}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_publish_load_list_republish(store, tmp_path: Path):
    name = f"tasks/t-{uuid.uuid4().hex[:8]}"
    info = publish_plan(store, f"{name}:1", plan_file(tmp_path))
    assert (info.name, info.tag, info.plan_name, info.unchanged) == (name, "1", "task-7", False)
    assert info.has_mutation and info.has_evaluator and info.groups == ["os/busybox:1", "repo/app:1"]
    manifest = json.loads(store.get_manifest(name, "1").data)
    assert manifest["artifactType"] == PLAN_ARTIFACT_TYPE and len(manifest["layers"]) == 1

    plan = load_published(store, f"{name}:1")
    assert plan.mutation_text == DIFF and plan.mutation is None  # self-contained: no file path
    assert plan.evaluator is not None and plan.evaluator.command == "true"
    assert plan.workdir == "/work/app"

    again = publish_plan(store, f"{name}:1", plan_file(tmp_path))
    assert again.unchanged and again.digest == info.digest
    changed = publish_plan(store, f"{name}:1", plan_file(tmp_path, workdir="/work"))
    assert not changed.unchanged and changed.digest != info.digest
    assert load_published(store, f"{name}:1").workdir == "/work"
    publish_plan(store, f"{name}:2", plan_file(tmp_path))
    mine = [(p.name, p.tag) for p in list_plans(store) if p.name == name]
    assert mine == [(name, "1"), (name, "2")]


def test_plans_and_groups_do_not_mix(store, tmp_path: Path):
    group = f"os/g-{uuid.uuid4().hex[:8]}"
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "f").write_text("x")
    publish_group(store, f"{group}:1", [tmp_path / "tree"])
    planned = f"tasks/p-{uuid.uuid4().hex[:8]}"
    publish_plan(store, f"{planned}:1", plan_file(tmp_path))
    assert planned not in {g.name for g in list_groups(store)}
    assert group not in {p.name for p in list_plans(store)}
    with pytest.raises(TemplateNotFound):
        load_published(store, f"{group}:1")  # a group is not a template
    with pytest.raises(TemplateNotFound):
        load_published(store, f"{planned}:nope")
    with pytest.raises(TemplateNotFound):
        load_published(store, "Not A Name")
    with pytest.raises(PlanInvalid):
        publish_plan(store, f"{planned}:2", {"groups": []})


def test_cli_publish_and_ls(store, tmp_path: Path, capsys):
    name = f"tasks/cli-{uuid.uuid4().hex[:8]}"
    path = plan_file(tmp_path)
    assert main(["plan", "publish", f"{name}:1", str(path), "--store", store.url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["name"] == name and doc["digest"].startswith("sha256:") and doc["store"] == store.url
    assert main(["plan", "ls", "--store", store.url, "--json"]) == 0
    listed = [p for p in json.loads(capsys.readouterr().out)["plans"] if p["name"] == name]
    assert [(p["tag"], p["digest"], p["has_mutation"]) for p in listed] == [("1", doc["digest"], True)]
    code = main(["plan", "publish", f"{name}:1", str(tmp_path / "missing.yaml"), "--store", store.url])
    err = capsys.readouterr().err
    assert code != 0 and err.startswith("error: plan_invalid:") and "Traceback" not in err
