"""Mountpoint hygiene: detecting a dead daemon's mount and removing it without wedging the host.

When the daemon dies, its FUSE connection is aborted: every request that the kernel cannot
answer from its caches fails with ENOTCONN ("Transport endpoint is not connected"); `stat` of
the mountpoint itself fails that way. Such a stale mount is detached lazily (umount2 with
MNT_DETACH): it vanishes from the namespace at once, and overlay mounts stacked on it
keep the dead superblock until they are unmounted themselves. Nothing here ever blocks on the
dead connection: no `stat` of anything below the mountpoint, and unmount is always lazy.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Iterator

from rollstack.errors import RuntimeFailure
from rollstack.host.mountinfo import mounted_at
from rollstack.host.umount import detach

__all__ = ["clear_stale", "is_stale", "lazy_unmount", "mounted_at", "pids_running", "processes"]

log = logging.getLogger(__name__)


def processes() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, argv) of every process whose command line is readable."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                argv = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            yield int(d.name), argv


def pids_running(*words: bytes) -> list[int]:
    """Pids of the processes whose command line has every one of `words` as an argument."""
    return [pid for pid, argv in processes() if all(w in argv for w in words)]


def is_stale(mountpoint: Path) -> bool:
    """True if a FUSE mount sits at `mountpoint` and its daemon is gone (ENOTCONN)."""
    fstype = mounted_at(mountpoint)
    if fstype is None or not fstype.startswith("fuse"):
        return False
    try:
        os.statvfs(mountpoint)  # never answered from kernel caches, unlike stat
    except OSError as exc:
        return exc.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    return False


def lazy_unmount(mountpoint: Path) -> bool:
    """Detach whatever is mounted at `mountpoint` (lazily: never waits on a dead daemon).

    True if something was detached; False when nothing was mounted there or the kernel refused
    (the refusal is logged; callers treat False as "still there" and decide).
    """
    try:
        return detach(mountpoint)
    except RuntimeFailure as exc:
        log.warning("could not detach %s: %s", mountpoint, exc)
        return False


def clear_stale(mountpoint: Path) -> bool:
    """Unmount a dead daemon's mount at `mountpoint`; True if one was removed."""
    removed = False
    while is_stale(mountpoint):  # stacked stale mounts: peel them all
        if not lazy_unmount(mountpoint):
            break
        removed = True
    return removed
