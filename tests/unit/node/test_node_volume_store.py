"""The node's volume directory (node/volumes.py) and which volume an environment path is in."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollstack.errors import AlreadyExists, InvalidRequest, UnsafePath, VolumeNotFound
from rollstack.node.volumes import Volumes, route_path
from rollstack.plan.volumes import VolumeMount


def test_create_get_list_and_a_delete_that_frees_the_name_at_once(tmp_path: Path) -> None:
    vols = Volumes(tmp_path)
    vols.start()
    a = vols.create("data")
    assert vols.get("data") == a and [v.name for v in vols.list()] == ["data"]
    (vols.data("data") / "f").write_text("x")
    with pytest.raises(AlreadyExists):
        vols.create("data")
    grave = vols.detach("data")
    assert vols.list() == [] and not (tmp_path / "volumes" / "data").exists()
    vols.create("data")  # the name is free while the old files are still being removed
    assert not (vols.data("data") / "f").exists()
    vols.remove(grave)
    assert not grave.exists()
    with pytest.raises(VolumeNotFound):
        vols.detach("nope")


def test_a_crashed_delete_is_finished_at_start_and_bad_names_never_touch_the_disk(tmp_path: Path) -> None:
    vols = Volumes(tmp_path)
    vols.start()
    vols.create("v")
    vols.detach("v")  # the crash: never removed
    Volumes(tmp_path).start()
    assert sorted(p.name for p in (tmp_path / "volumes").iterdir()) == []
    for bad in ("..", ".", "a/b", "../../etc", ""):
        with pytest.raises(InvalidRequest):
            vols.create(bad)
        with pytest.raises(VolumeNotFound):
            vols.get(bad)
    assert list((tmp_path / "volumes").iterdir()) == []


def test_paths_are_routed_to_the_volume_mounted_above_them() -> None:
    mounts = [VolumeMount(name="data", path="/mnt/data"), VolumeMount(name="ws", path="/work/ws", read_only=True)]
    assert route_path(mounts, "/mnt/data/x/y.txt") == (mounts[0], "/x/y.txt")
    assert route_path(mounts, "/mnt/data") == (mounts[0], "/")
    assert route_path(mounts, "mnt//data/./z") == (mounts[0], "/z")
    assert route_path(mounts, "/mnt/database/z") == (None, "/mnt/database/z")  # a prefix, not a parent
    assert route_path(mounts, "/work/ws/out") == (mounts[1], "/out")
    assert route_path([], "/anything") == (None, "/anything")
    with pytest.raises(UnsafePath):
        route_path(mounts, "/mnt/data/../../etc/passwd")
