"""Unmounting through umount2(2) (libc via ctypes): no `umount`/`fusermount` subprocess."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from rollstack.errors import RuntimeFailure
from rollstack.host import libc
from rollstack.host.libc import MNT_DETACH
from rollstack.host.mountinfo import is_mounted


def umount2(target: Path | str, flags: int = 0) -> int:
    """One umount2(2) call: 0, or the errno it failed with."""
    return libc.umount2(os.path.realpath(target), flags)


def unmount(target: Path | str) -> None:
    """Unmount everything stacked at `target`; idempotent; detaches lazily (MNT_DETACH) when busy."""
    while is_mounted(target):
        err = umount2(target)
        if err == 0:
            continue
        if err in (errno.EINVAL, errno.ENOENT) and not is_mounted(target):
            return
        if err == errno.EBUSY:
            err = umount2(target, MNT_DETACH)
            if err == 0:
                continue
        raise RuntimeFailure(f"unmount of {target} failed: {os.strerror(err)}", errno=err)


def detach(target: Path | str) -> bool:
    """Lazily detach whatever is mounted at `target` (never waits on a dead FUSE daemon).

    False when nothing was mounted there; RuntimeFailure when the kernel refuses.
    """
    if not is_mounted(target):
        return False
    while is_mounted(target):
        err = umount2(target, MNT_DETACH)
        if err not in (0, errno.EINVAL, errno.ENOENT):
            raise RuntimeFailure(f"detaching {target} failed: {os.strerror(err)}", errno=err)
        if err:
            break
    return True
