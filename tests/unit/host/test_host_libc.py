"""`host.libc`: one loaded C library whose calls report the errno (the mount and syscall paths of
run.overlay, run.userns, lowers.erofs and host.umount go through it)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from rollstack.host import libc


def test_mount_reports_the_errno(tmp_path: Path) -> None:
    assert libc.mount(b"none", tmp_path / "missing", b"tmpfs") == errno.ENOENT
    assert libc.mount(b"none", tmp_path, b"no-such-filesystem") in (errno.ENODEV, errno.EPERM)


def test_umount2_of_something_not_mounted(tmp_path: Path) -> None:
    assert libc.umount2(tmp_path) in (errno.EINVAL, errno.EPERM)


def test_a_failing_syscall_raises_with_its_errno() -> None:
    with pytest.raises(OSError) as info:
        libc.syscall(-1)
    assert info.value.errno == errno.ENOSYS
