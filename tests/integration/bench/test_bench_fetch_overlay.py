"""`bench fetch`'s overlay helper mounts through production's overlay code (run.overlay, pinned
options) and leaves nothing mounted; an explicit option set (the overlay-options section) is
mounted with exactly those options (the kernel lists only non-default ones)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollstack_bench.fetch.rig import overlay
from rollstack.host import mountinfo
from rollstack.host.umount import unmount
from rollstack.run.overlay import mount_overlay

pytestmark = pytest.mark.integration


def _layers(tmp_path: Path) -> list[Path]:
    tmp_path.mkdir(exist_ok=True)
    top, bottom = tmp_path / "top", tmp_path / "bottom"
    for d, x in ((top, "top"), (bottom, "bottom")):
        d.mkdir()
        (d / "x").write_text(x)
    (bottom / "y").write_text("y")
    return [top, bottom]


def _options_at(path: Path) -> str:
    return [m.options for m in mountinfo.read() if m.mount_point == str(path)][-1]


def _keys(options: str) -> list[str]:
    return sorted(o.split("=")[0] for o in options.split(","))


def _production_keys(lowers: list[Path], scratch: Path) -> list[str]:
    dirs = [scratch / n for n in ("pu", "pw", "pm")]
    for d in dirs:
        d.mkdir()
    mount_overlay(lowers, *dirs)
    try:
        return _keys(_options_at(dirs[2]))
    finally:
        unmount(dirs[2])


def test_default_overlay_is_productions_mount_and_is_removed(tmp_path: Path) -> None:
    with overlay(_layers(tmp_path), tmp_path) as merged:
        assert mountinfo.mounted_at(merged) == "overlay"
        assert (merged / "x").read_text() == "top" and (merged / "y").read_text() == "y"
        # the kernel lists the options the mount was made with (`lowerdir+` from the new mount API)
        assert _keys(_options_at(merged)) == _production_keys(_layers(tmp_path / "p"), tmp_path)
        (merged / "new").write_text("w")  # copy-up lands in the upper dir, not in a lower
    assert mountinfo.mounted_at(merged) is None and not merged.exists()
    assert not (tmp_path / "top/new").exists()


def test_explicit_options_are_passed_as_given(tmp_path: Path) -> None:
    with overlay(_layers(tmp_path), tmp_path, "metacopy=on") as merged:
        opts = _options_at(merged).split(",")
        assert "metacopy=on" in opts and any(o.startswith("lowerdir=") for o in opts)
        assert (merged / "x").read_text() == "top"
    assert mountinfo.mounted_at(merged) is None
