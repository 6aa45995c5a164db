"""rollstack.run.lateroot's pure part: which mounts the root switch moves (the spec's top-level
destinations; submounts travel with their parents)."""

from __future__ import annotations

import pytest

from rollstack.errors import InvalidRequest
from rollstack.run.lateroot import mount_entries
from rollstack.run.ocispec import InitBinaries, SpecParams, build_spec


def test_the_top_level_destinations_of_a_real_spec(tmp_path) -> None:
    bins = []
    for name in ("init", "tini", "busybox"):
        (tmp_path / name).write_text("")
        bins.append(str(tmp_path / name))
    spec = build_spec("/r", SpecParams("e1", init=InitBinaries(*bins)))
    assert sorted(mount_entries(spec)) == ["d/dev", "d/proc", "d/sys", "f/.rollstack/busybox",
                                           "f/.rollstack/init", "f/.rollstack/tini"]


def test_files_dirs_and_bad_destinations(tmp_path) -> None:
    f = tmp_path / "bin"
    f.write_text("x")
    spec = {"mounts": [{"destination": "/a/b", "type": "bind", "source": str(f)},
                       {"destination": "/a", "type": "tmpfs", "source": "tmpfs"},
                       {"destination": "/ab", "type": "bind", "source": str(tmp_path)}]}
    assert mount_entries(spec) == ["d/a", "d/ab"]  # /a/b rides on /a; /ab is not under /a
    assert mount_entries({"mounts": [{"destination": "/x/y", "type": "bind", "source": str(f)}]}) == ["f/x/y"]
    for bad in ("/", "relative"):
        with pytest.raises(InvalidRequest):
            mount_entries({"mounts": [{"destination": bad, "type": "tmpfs"}]})


def test_the_switched_targets_are_read_from_partial_output() -> None:
    from rollstack.run.lateroot import switched

    assert switched("1 ok\n0 failed\n", 3) == {1}
    assert switched("2 ok\n0 o", 3) == {2}  # a killed switch's output ends anywhere
    assert switched("5 ok\nx ok\n-1 ok\n1 okay\n", 3) == set()  # out of range or malformed
    assert switched("", 2) == set()
