"""Mountpoint hygiene reads mountinfo through host.mountinfo: non-ASCII mount points survive."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollstack.host import mountinfo
from rollstack.lazystore import recovery


def _escape(path: str) -> str:
    """A path as the kernel writes it in mountinfo: space, tab, newline, backslash as \\ooo."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in path)


@pytest.fixture
def fake_mountinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def install(*mounts: tuple[Path, str]) -> None:
        lines = [f"{20 + i} 1 0:{40 + i} / {_escape(str(p))} rw - {fstype} src rw"
                 for i, (p, fstype) in enumerate(mounts)]
        f = tmp_path / "mountinfo"
        f.write_bytes(("\n".join(lines) + "\n").encode())
        monkeypatch.setattr(mountinfo, "MOUNTINFO", f)
    return install


def test_a_non_ascii_mount_point_is_found(tmp_path: Path, fake_mountinfo):
    point = tmp_path / "café ünï 環境"
    point.mkdir()
    fake_mountinfo((point, "fuse.rollstack"))
    assert recovery.mounted_at(point) == "fuse.rollstack"
    assert recovery.mounted_at(tmp_path / "cafe") is None


def test_a_live_fuse_mount_is_not_stale(tmp_path: Path, fake_mountinfo):
    point = tmp_path / "mnt ü"
    point.mkdir()
    fake_mountinfo((point, "tmpfs"), (point, "fuse.rollstack"))  # the top of the stack counts
    assert recovery.mounted_at(point) == "fuse.rollstack"
    assert recovery.is_stale(point) is False  # statvfs answers: not a dead daemon


def test_lazy_unmount_of_nothing_is_false(tmp_path: Path, fake_mountinfo):
    fake_mountinfo()
    assert recovery.lazy_unmount(tmp_path) is False
