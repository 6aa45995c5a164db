"""Unmounting through umount2(2) (libc via ctypes): no `umount`/`fusermount` subprocess."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from pathlib import Path

from rollstack.errors import RuntimeFailure
from rollstack.host.mountinfo import is_mounted

MNT_DETACH = 2

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def umount2(target: Path | str, flags: int = 0) -> int:
    """One umount2(2) call: 0, or the errno it failed with."""
    if _libc.umount2(os.fsencode(os.path.realpath(target)), flags) == 0:
        return 0
    return ctypes.get_errno()


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
