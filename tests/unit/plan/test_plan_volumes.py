"""Volume mounts in a plan: names, mount points, one mount per volume (pure validation)."""

from __future__ import annotations

import pytest

from rollstack.errors import InvalidRequest, PlanInvalid
from rollstack.plan.model import load_plan as parse_plan
from rollstack.plan.volumes import MAX_MOUNTS, check_name


def _plan(volumes: object) -> dict[str, object]:
    return {"name": "t", "groups": ["base:1"], "volumes": volumes}


def test_a_mount_is_normalised_and_read_write_by_default() -> None:
    plan = parse_plan(_plan([{"name": "data.v1", "path": "/mnt//data/"}]))
    assert [(m.name, m.path, m.read_only) for m in plan.volumes] == [("data.v1", "/mnt/data", False)]


@pytest.mark.parametrize("name", ["..", ".", "a/b", "", "-x", "x" * 64, "a\0b", "é"])
def test_hostile_or_malformed_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidRequest):
        check_name(name)
    with pytest.raises(PlanInvalid, match="volumes.0.name"):
        parse_plan(_plan([{"name": name, "path": "/data"}]))


@pytest.mark.parametrize("path", ["data", "/", "/a/../b", "/proc", "/dev/shm/x", "/sys", "/.rollstack/init"])
def test_mount_points_outside_the_allowed_tree_are_refused(path: str) -> None:
    with pytest.raises(PlanInvalid, match="volumes.0.path"):
        parse_plan(_plan([{"name": "v", "path": path}]))


@pytest.mark.parametrize("mounts", [
    [{"name": "v", "path": "/a"}, {"name": "v", "path": "/b"}],
    [{"name": "v", "path": "/a"}, {"name": "w", "path": "/a/b"}],
    [{"name": "v", "path": "/a"}, {"name": "w", "path": "/a/"}],
    [{"name": f"v{i}", "path": f"/m{i}"} for i in range(MAX_MOUNTS + 1)],
    [{"name": "v", "path": "/a", "writable": True}],
])
def test_overlapping_repeated_or_too_many_mounts_are_refused(mounts: list[dict[str, object]]) -> None:
    with pytest.raises(PlanInvalid, match="volumes"):
        parse_plan(_plan(mounts))
