"""Mountpoint hygiene: detecting a dead daemon's mount and removing it without wedging the host.

When the daemon dies, its FUSE connection is aborted: every request that the kernel cannot
answer from its caches fails with ENOTCONN ("Transport endpoint is not connected"); `stat` of
the mountpoint itself fails that way. Such a stale mount is detached lazily (`umount -l`, or
`fusermount3 -u -z`): it vanishes from the namespace at once, and overlay mounts stacked on it
keep the dead superblock until they are unmounted themselves. Nothing here ever blocks on the
dead connection: no `stat` of anything below the mountpoint, and unmount is always lazy.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path


def pids_running(*words: bytes) -> list[int]:
    """Pids of the processes whose command line has every one of `words` as an argument."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                argv = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if all(w in argv for w in words):
                pids.append(int(d.name))
    return pids


def mounted_at(mountpoint: Path) -> str | None:
    """The filesystem type mounted exactly at `mountpoint` (from /proc/self/mountinfo), or None."""
    target = os.path.realpath(mountpoint)
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            sep = parts.index("-")
            mp = parts[4].encode().decode("unicode_escape")
            if mp == target:
                found = parts[sep + 1]  # the last (top) mount wins
    return found


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
    """Detach whatever is mounted at `mountpoint` (lazily: never waits on a dead daemon)."""
    if mounted_at(mountpoint) is None:
        return False
    for cmd in (["fusermount3", "-u", "-z", str(mountpoint)], ["umount", "-l", str(mountpoint)]):
        try:
            if subprocess.run(cmd, capture_output=True, timeout=10).returncode == 0:
                return True
        except (OSError, subprocess.TimeoutExpired):
            continue
    return mounted_at(mountpoint) is None


def abort_connection(mountpoint: Path) -> bool:
    """Abort the FUSE connection behind `mountpoint` via /sys/fs/fuse/connections (a hung daemon)."""
    try:
        dev = os.stat(mountpoint).st_dev
    except OSError:
        return False
    abort = Path(f"/sys/fs/fuse/connections/{os.minor(dev)}/abort")
    try:
        abort.write_text("1")
        return True
    except OSError:
        return False


def clear_stale(mountpoint: Path) -> bool:
    """Unmount a dead daemon's mount at `mountpoint`; True if one was removed."""
    removed = False
    while is_stale(mountpoint):  # stacked stale mounts: peel them all
        if not lazy_unmount(mountpoint):
            break
        removed = True
    return removed
