"""The group/plan CLI end to end on both stores: publish, ls, resolve, and the error line."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from rollstack.cli.main import main

pytestmark = pytest.mark.integration


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_publish_ls_resolve(store, tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    spec = store.url
    (tmp_path / "l1/etc").mkdir(parents=True)
    (tmp_path / "l1/etc/f").write_text("1\n")
    (tmp_path / "l2").mkdir()
    (tmp_path / "l2/g").write_text("2\n")
    name = f"os/cli-{uuid.uuid4().hex[:8]}"

    code, out, _ = run(capsys, "group", "publish", f"{name}:1", str(tmp_path / "l1"), str(tmp_path / "l2"), "--store", spec)
    assert code == 0 and out.strip().startswith("sha256:")
    digest = out.strip()
    code, out, _ = run(capsys, "group", "publish", f"{name}:1", str(tmp_path / "l1"), str(tmp_path / "l2"),
                       "--store", spec, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["digest"] == digest and doc["uploaded_bytes"] == 0

    code, out, _ = run(capsys, "group", "ls", "--store", spec, "--json")
    listing = json.loads(out)
    mine = [g for g in listing["groups"] if g["name"] == name]
    assert code == 0 and mine[0]["digest"] == digest and mine[0]["layers"] == 2 and listing["artifacts"] >= 1

    plan = tmp_path / "plan.yaml"
    plan.write_text(f"name: p\ngroups: [{name}:1]\n")
    monkeypatch.setenv("ROLLSTACK_STORE", spec)  # --store defaults to the environment
    code, out, _ = run(capsys, "plan", "resolve", str(plan), "--json")
    resolved = json.loads(out)
    assert code == 0 and [layer["group"] for layer in resolved["layers"]] == [f"{name}:1"] * 2
    assert set(resolved["layers"][0]) >= {"digest", "size", "group"}

    plan.write_text(f"groups: [{name}:nope]\n")
    code, out, err = run(capsys, "plan", "resolve", str(plan), "--json")
    assert code == 1 and out == "" and err.strip() == f"error: group_not_found: group '{name}:nope' not found in {spec}"

    plan.write_text(f"groups: [{name}:1]\nresources: {{memory: 12Qi}}\n")
    code, _, err = run(capsys, "plan", "resolve", str(plan))
    assert code == 1 and err.startswith("error: plan_invalid: resources.memory: '12Qi' is not a size")
