"""One environment's overlayfs root: mount (unmount and is-mounted are `rollstack.host`'s).

The layer stack (top first) becomes the overlay's lower dirs; a private upper and work dir on
local disk take the environment's writes. Lower dirs may be anything overlayfs accepts as a lower
(in production: per-layer directories served by the node's FUSE lazy store; in tests: plain
directories).

Long stacks: the classic mount(2) call takes all options in one page (4096 bytes), which ~40
layers of `/var/lib/rollstack/lazy/layers/<64 hex>` paths exceed. We therefore mount with the new
mount API (fsopen/fsconfig/fsmount/move_mount, Linux >= 5.2) and pass each lower with its own
`lowerdir+` key (Linux >= 6.8), which has no length limit; the kernel's own limit is 500 lowers
(OVL_MAX_STACK). On an older kernel we fall back to mount(2) with a single `lowerdir=` string,
which must fit in a page (RuntimeFailure otherwise).

Options are pinned so the upper dir keeps the simple format `rollstack.run.diff` reads:
`redirect_dir=off` (a renamed lower dir is copied up, not redirected), `metacopy=off` (every
copied-up file carries its data), `index=off`, `xino=off`.

`volatile` (Linux >= 5.10): overlayfs skips every sync of the upper filesystem. An environment's
upper is thrown away with it and never mounted again, so there is nothing to make durable, and
without it each unmount (every destroy) runs syncfs(2) on the node's whole filesystem: it wrote
back whatever any other writer left dirty, 1.05 s once after a 431 MB layer was materialized,
beside the next create (docs/benchmarks.md, "Tenth pass"). `fsync` inside an environment becomes
a no-op too. A kernel that refuses the option mounts without it.
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

from rollstack.errors import InvalidRequest, RuntimeFailure
from rollstack.host import libc
# Re-exported: callers treat "is the overlay mounted / unmount it" as part of this module.
from rollstack.host.mountinfo import is_mounted, mount_points  # noqa: F401
from rollstack.host.umount import unmount  # noqa: F401

OVERLAY_MAX_LOWERS = 500
PAGE_LIMIT = 4095
MOUNT_SOURCE = "rollstack"  # shown in mountinfo: lets recovery tell our overlays apart
PINNED_OPTIONS = (("redirect_dir", "off"), ("metacopy", "off"), ("index", "off"), ("xino", "off"))
FLAG_OPTIONS = ("volatile",)

# New mount API syscall numbers are the same on every architecture (allocated after 5.0).
_SYS_MOVE_MOUNT, _SYS_FSOPEN, _SYS_FSCONFIG, _SYS_FSMOUNT = 429, 430, 431, 432
_FSOPEN_CLOEXEC = 0x1
_FSCONFIG_SET_FLAG, _FSCONFIG_SET_STRING, _FSCONFIG_CMD_CREATE = 0, 1, 6
_FSMOUNT_CLOEXEC = 0x1
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_AT_FDCWD = -100


def _check_path(p: Path, what: str) -> bytes:
    raw = os.fsencode(str(p))
    # ',' and ':' separate options / lowers in the mount(2) string; '\n' breaks mountinfo.
    if any(c in raw for c in (b",", b":", b"\n")) and what != "target":
        raise InvalidRequest(f"overlay {what} path contains ',' ':' or newline: {p}")
    return raw


def _fs_messages(fsfd: int) -> str:
    """The kernel's error log of an fs context (lines like 'e overlayfs: ...')."""
    out = []
    while True:
        try:
            msg = os.read(fsfd, 1024)
        except OSError:
            break
        if not msg:
            break
        out.append(msg.decode(errors="replace").strip())
    return "; ".join(out)


class _OldKernel(Exception):
    """The kernel lacks the new mount API or overlay's `lowerdir+` key."""


def _mount_new_api(lowers: list[Path], upper: Path, work: Path, target: Path) -> None:
    try:
        fsfd = libc.syscall(_SYS_FSOPEN, b"overlay", ctypes.c_uint(_FSOPEN_CLOEXEC))
    except OSError as e:
        if e.errno == errno.ENOSYS:
            raise _OldKernel from e
        raise RuntimeFailure(f"fsopen(overlay) failed: {e.strerror}", errno=e.errno) from e
    try:
        def fsconfig(cmd: int, key: str | None = None, value: bytes | None = None) -> None:
            libc.syscall(_SYS_FSCONFIG, ctypes.c_int(fsfd), ctypes.c_uint(cmd),
                         None if key is None else key.encode(), value, ctypes.c_int(0))

        def setstr(key: str, value: bytes | None) -> None:
            fsconfig(_FSCONFIG_SET_STRING, key, value)

        try:
            setstr("lowerdir+", _check_path(lowers[0], "lower"))
        except OSError as e:
            if e.errno == errno.EINVAL:
                raise _OldKernel from e
            raise
        try:
            for lower in lowers[1:]:
                setstr("lowerdir+", _check_path(lower, "lower"))
            setstr("source", MOUNT_SOURCE.encode())
            setstr("upperdir", _check_path(upper, "upper"))
            setstr("workdir", _check_path(work, "work"))
            for key, value in PINNED_OPTIONS:
                setstr(key, value.encode())
            for key in FLAG_OPTIONS:
                try:
                    fsconfig(_FSCONFIG_SET_FLAG, key)
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        raise
            fsconfig(_FSCONFIG_CMD_CREATE)
            mfd = libc.syscall(_SYS_FSMOUNT, ctypes.c_int(fsfd), ctypes.c_uint(_FSMOUNT_CLOEXEC),
                               ctypes.c_uint(0))
        except OSError as e:
            raise RuntimeFailure(f"overlay mount of {target} failed: {e.strerror}: "
                                 f"{_fs_messages(fsfd)}", errno=e.errno) from e
        try:
            libc.syscall(_SYS_MOVE_MOUNT, ctypes.c_int(mfd), b"", ctypes.c_int(_AT_FDCWD),
                         _check_path(target, "target"), ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH))
        except OSError as e:
            raise RuntimeFailure(f"overlay attach at {target} failed: {e.strerror}",
                                 errno=e.errno) from e
        finally:
            os.close(mfd)
    finally:
        os.close(fsfd)


def classic_options(lowers: list[Path], upper: Path, work: Path, flags: bool = True) -> str:
    """The single mount(2) option string (used on kernels without `lowerdir+`)."""
    lower = ":".join(os.fspath(p) for p in lowers)
    pinned = ",".join([f"{k}={v}" for k, v in PINNED_OPTIONS] + (list(FLAG_OPTIONS) if flags else []))
    return f"lowerdir={lower},upperdir={upper},workdir={work},{pinned}"


def _mount_classic(lowers: list[Path], upper: Path, work: Path, target: Path) -> None:
    for p, what in [(x, "lower") for x in lowers] + [(upper, "upper"), (work, "work")]:
        _check_path(p, what)
    opts = classic_options(lowers, upper, work)
    if len(opts.encode()) > PAGE_LIMIT:
        raise RuntimeFailure(f"overlay options for {len(lowers)} lowers are {len(opts)} bytes, "
                             f"over mount(2)'s page limit, and this kernel lacks lowerdir+")
    err = libc.mount(MOUNT_SOURCE.encode(), target, b"overlay", 0, opts.encode())
    if err == errno.EINVAL:  # a kernel older than the flag options (volatile: 5.10)
        err = libc.mount(MOUNT_SOURCE.encode(), target, b"overlay", 0,
                         classic_options(lowers, upper, work, flags=False).encode())
    if err:
        raise RuntimeFailure(f"overlay mount of {target} failed: {os.strerror(err)}", errno=err)


def mount_overlay(lowers: list[Path], upper: Path, work: Path, target: Path) -> None:
    """Mount an overlay of `lowers` (top first) with `upper`/`work` at `target`.

    `upper` and `work` must be empty-or-previous dirs on the same local filesystem; all four
    must exist. Raises InvalidRequest for bad input, RuntimeFailure when the kernel refuses.
    """
    if not lowers:
        raise InvalidRequest("overlay needs at least one lower dir")
    if len(lowers) > OVERLAY_MAX_LOWERS:
        raise InvalidRequest(f"{len(lowers)} layers: overlayfs stacks at most "
                             f"{OVERLAY_MAX_LOWERS}")
    for p in (*lowers, upper, work, target):
        if not Path(p).is_dir():
            raise InvalidRequest(f"overlay dir does not exist: {p}")
    try:
        _mount_new_api(list(lowers), upper, work, target)
    except _OldKernel:
        _mount_classic(list(lowers), upper, work, target)
