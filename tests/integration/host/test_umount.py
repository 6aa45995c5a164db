"""Unmounting real mounts through umount2(2): stacked, busy (lazy detach), idempotent, and a
mount point whose name needs mountinfo escapes and UTF-8."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from rollstack.host import mountinfo
from rollstack.host.umount import detach, unmount

pytestmark = pytest.mark.integration


def _tmpfs(target: Path) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "rs-host-test", str(target)], check=True)


@pytest.fixture
def point(tmp_path: Path):
    target = tmp_path / "caf\u00e9 with space"
    target.mkdir()
    yield target
    while mountinfo.is_mounted(target):
        subprocess.run(["umount", "-l", str(target)], check=False)


def test_unmount_removes_stacked_mounts_and_is_idempotent(point: Path) -> None:
    _tmpfs(point)
    _tmpfs(point)
    assert mountinfo.mounted_at(point) == "tmpfs"
    assert str(point) in mountinfo.mounts_under(point.parent)
    unmount(point)
    assert not mountinfo.is_mounted(point)
    unmount(point)  # nothing there: no error


def test_unmount_of_a_busy_mount_detaches_it(point: Path) -> None:
    _tmpfs(point)
    fd = os.open(point / "f", os.O_CREAT | os.O_WRONLY)
    os.chdir("/")
    try:
        unmount(point)
        assert not mountinfo.is_mounted(point)
        os.write(fd, b"still writable through the open fd")
    finally:
        os.close(fd)


def test_detach_reports_whether_something_was_mounted(point: Path) -> None:
    assert detach(point) is False
    _tmpfs(point)
    assert detach(point) is True and not mountinfo.is_mounted(point)
