"""Snapshots in a store (rollstack.plan.snapshots): listed from `*-fs` groups whose plan exists,
deleted plan first, refused while another plan stacks them; other kinds never touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollstack.errors import InvalidRequest, TemplateNotFound
from rollstack.plan.groups import publish_group
from rollstack.plan.published import publish_plan
from rollstack.plan.snapshots import KIND, delete_snapshot, group_of, list_snapshots, source_desc
from rollstack.store.ocilayout import OciLayoutStore


def _snapshot(store, tmp: Path, name_tag: str, env_id: str, groups: list[str], text: str) -> None:
    tree = tmp / f"tree-{name_tag.replace('/', '_').replace(':', '_')}"
    tree.mkdir(parents=True)
    (tree / "state.txt").write_text(text)
    group = group_of(name_tag)
    publish_group(store, group, [tree], kind=KIND, source_desc=source_desc(env_id), work_dir=tmp)
    publish_plan(store, name_tag, {"name": name_tag.split(":")[0], "groups": [*groups, group]})


@pytest.fixture
def store(tmp_path: Path):
    s = OciLayoutStore(tmp_path / "store")
    base = tmp_path / "base"
    base.mkdir()
    (base / "etc").mkdir()
    publish_group(s, "os/base:1", [base], work_dir=tmp_path)
    publish_plan(s, "task/plain:1", {"name": "plain", "groups": ["os/base:1"]})
    try:
        yield s
    finally:
        s.close()


def test_list_and_delete(store, tmp_path: Path) -> None:
    _snapshot(store, tmp_path, "snap/a:t1", "e1", ["os/base:1"], "a")
    _snapshot(store, tmp_path, "snap/b:t1", "e2", ["os/base:1"], "b")
    assert [(s.plan, s.source) for s in list_snapshots(store)] == [("snap/a:t1", "e1"), ("snap/b:t1", "e2")]
    assert [s.plan for s in list_snapshots(store, source="e2")] == ["snap/b:t1"]
    only = list_snapshots(store, source="e1")[0]
    assert only.group == "snap/a-fs:t1" and only.bytes > 0 and only.layer.startswith("sha256:")
    delete_snapshot(store, "snap/a:t1")
    assert [s.plan for s in list_snapshots(store)] == ["snap/b:t1"]
    assert not store.has_manifest("snap/a", "t1") and not store.has_manifest("snap/a-fs", "t1")
    for name in ("snap/a:t1", "task/plain:1", "os/base:1", "no/such:x"):
        with pytest.raises(TemplateNotFound):
            delete_snapshot(store, name)  # gone, a plain plan, a plain group, nothing
    assert store.has_manifest("task/plain", "1") and store.has_manifest("os/base", "1")


def test_a_snapshot_another_one_stacks_is_kept(store, tmp_path: Path) -> None:
    _snapshot(store, tmp_path, "snap/a:t1", "e1", ["os/base:1"], "a")
    _snapshot(store, tmp_path, "snap/b:t1", "e2", ["os/base:1", "snap/a-fs:t1"], "b")  # taken of an env of a
    with pytest.raises(InvalidRequest, match="stacked by snap/b:t1"):
        delete_snapshot(store, "snap/a:t1")
    assert [s.plan for s in list_snapshots(store)] == ["snap/a:t1", "snap/b:t1"]
    delete_snapshot(store, "snap/b:t1")
    delete_snapshot(store, "snap/a:t1")  # nothing stacks it any more
    assert list_snapshots(store) == []


def test_a_group_without_its_plan_is_not_listed(store, tmp_path: Path) -> None:
    tree = tmp_path / "half"
    tree.mkdir()
    (tree / "x").write_text("x")
    publish_group(store, "snap/half-fs:t1", [tree], kind=KIND, source_desc=source_desc("e9"), work_dir=tmp_path)
    assert list_snapshots(store) == []  # a publish still under way (the plan goes last)
    delete_snapshot(store, "snap/half:t1")  # what a half-finished publish left is removable
    assert not store.has_manifest("snap/half-fs", "t1")
