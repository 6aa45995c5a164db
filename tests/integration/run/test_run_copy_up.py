"""SafeRoot.copy_up_dirs on a real overlay: the directories on a path move into the upper (a
warm sandbox makes them before its handout), nothing else does, no diff shows, and symlinks in
the image are never followed out of the root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rollstack.run.diff import upper_diff
from rollstack.run.files import SafeRoot
from rollstack.run.lowerview import LowerView
from rollstack.run.overlay import mount_overlay, unmount

pytestmark = pytest.mark.integration


@pytest.fixture
def merged(tmp_path: Path):
    lower = tmp_path / "lower"
    (lower / "work" / "app" / "src").mkdir(parents=True)
    (lower / "work" / "app" / "main.py").write_text("print(1)\n")
    os.chmod(lower / "work", 0o2775)  # a setgid dir keeps its bits
    os.chown(lower / "work" / "app", 1000, 1000)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink("/", lower / "abs")  # an image's absolute link: must not reach the host
    os.symlink("work", lower / "rel")
    for d in ("upper", "work", "merged"):
        (tmp_path / d).mkdir()
    mount_overlay([lower], tmp_path / "upper", tmp_path / "work", tmp_path / "merged")
    try:
        yield tmp_path
    finally:
        unmount(tmp_path / "merged")


def test_the_dirs_on_the_path_are_copied_up_unchanged_and_no_diff_shows(merged: Path) -> None:
    upper, lower = merged / "upper", merged / "lower"
    assert SafeRoot(merged / "merged").copy_up_dirs("/work/app") == 2
    assert sorted(str(p.relative_to(upper)) for p in upper.rglob("*")) == ["work", "work/app"]
    for rel in ("work", "work/app"):
        a, b = os.stat(lower / rel), os.stat(upper / rel)
        assert (a.st_mode, a.st_uid, a.st_gid) == (b.st_mode, b.st_uid, b.st_gid)
    assert upper_diff(upper, LowerView([lower])) == ""
    # and a write there afterwards behaves as before
    (merged / "merged" / "work" / "app" / "new.txt").write_text("x\n")
    assert "new.txt" in upper_diff(upper, LowerView([lower]))


def test_missing_parts_and_symlinks_stop_it(merged: Path) -> None:
    root = SafeRoot(merged / "merged")
    assert root.copy_up_dirs("/work/nope/deeper") == 1  # /work, then stops
    assert root.copy_up_dirs("/abs/etc") == 0  # a symlink is never followed
    assert root.copy_up_dirs("/rel/app") == 0
    assert root.copy_up_dirs("/work/app/main.py") == 2  # a file ends it
    assert not (merged / "upper" / "abs").exists() and not (merged / "upper" / "rel").exists()
    assert sorted(str(p.relative_to(merged / "upper")) for p in (merged / "upper").rglob("*")) == ["work", "work/app"]
