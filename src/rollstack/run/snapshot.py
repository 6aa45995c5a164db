"""Freezing an environment's filesystem changes into a read-only layer directory (fork).

`copy_upper(upper, dst)` copies an overlay upper dir as it is: files, directories, symlinks,
owners, modes, times, xattrs (`trusted.overlay.opaque` included) and whiteouts (0/0 character
devices), so the copy works as a lower layer below a fresh upper with overlayfs' own rules. The
caller freezes the environment first (`Environment.cut()`: a gVisor sandbox syncs its own
caches first), so no write lands mid-copy.
The copy goes to `<dst>.tmp` and is renamed into place: a crash never leaves half a layer.
It is made by rollstack-treecp (native/treecp: `cp -a` with half the system calls per file,
docs/fork.md) when built, else, or for a tree it does not take (exit 3: deeper than its
descriptors allow), by `cp -a`.

`merge_uppers(layers, dst)` applies upper dirs (top first) one over another into `dst` with
overlayfs' rules (a whiteout deletes, an opaque directory replaces, anything else overwrites):
the changes of a forked environment since its stack's first lower (its own upper over the
layers it was forked from), what its diff compares against the base layers.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import stat as statmod
import subprocess
from pathlib import Path

from rollstack.errors import DiskFull, RuntimeFailure
from rollstack.host.tree import remove_tree
from rollstack.run.initbin import find_native
from rollstack.run.lowerview import OPAQUE_XATTR

log = logging.getLogger(__name__)

COPY_TIMEOUT = 600.0
TREECP_NAME = "rollstack-treecp"
_TREECP_UNSUPPORTED = 3
_TREECP_FULL = 4


def copy_upper(upper: Path, dst: Path) -> None:
    """Copy `upper` to `dst` (which must not exist); its size is `tree_size(dst)` (not taken
    here: the caller holds the environment frozen for the copy alone)."""
    tmp = dst.with_name(dst.name + ".tmp")
    remove_tree(tmp)
    try:
        _cp(upper, tmp)
    except BaseException:
        remove_tree(tmp)
        raise
    os.rename(tmp, dst)


def tree_size(root: Path) -> dict[str, int]:
    """{"files", "bytes"}: the entries under `root` that are not directories, and their sizes.
    GNU find walks it (any depth: os.walk recurses per level and an environment's upper can be
    deeper than Python's recursion limit)."""
    proc = subprocess.run(["find", str(root), "-mindepth", "1", "!", "-type", "d", "-printf", "%s\\n"],
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=COPY_TIMEOUT)
    sizes = proc.stdout.split()
    return {"files": len(sizes), "bytes": sum(int(s) for s in sizes)}


def merge_uppers(layers: list[Path], dst: Path) -> None:
    """`layers` (upper dirs, top first) merged into `dst` (must not exist) with overlay rules.
    A tree deeper than Python's recursion limit is a RuntimeFailure."""
    if not layers:
        dst.mkdir()
        return
    *above, bottom = layers
    _cp(bottom, dst)
    try:
        for layer in reversed(above):
            _apply(layer, dst)
    except RecursionError:
        raise RuntimeFailure(f"the changes in {layers[0]} are nested too deep to merge", path=str(layers[0])) from None


def _is_whiteout(st: os.stat_result) -> bool:
    return statmod.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _opaque(path: Path) -> bool:
    try:
        return os.getxattr(path, OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        remove_tree(path)
    elif os.path.lexists(path):
        path.unlink()


def _apply(layer: Path, dst: Path) -> None:
    """One upper dir over `dst`, entry by entry."""
    for entry in os.scandir(layer):
        src, target = Path(entry.path), dst / entry.name
        st = entry.stat(follow_symlinks=False)
        if statmod.S_ISDIR(st.st_mode):
            if _opaque(src) or not (target.is_dir() and not target.is_symlink()):
                _remove(target)
                _cp(src, target)
            else:
                _apply(src, target)
                shutil.copystat(src, target, follow_symlinks=False)
                os.chown(target, st.st_uid, st.st_gid, follow_symlinks=False)
            continue
        _remove(target)  # a whiteout stays a whiteout: the diff reads it as a deletion
        _cp(src, target)


@functools.cache
def _treecp() -> str | None:
    found = find_native(TREECP_NAME)
    if found is None:
        log.warning("%s not found (`make setup` builds it): forks copy with cp -a (slower)", TREECP_NAME)
    return found


def _cp(src: Path, dst: Path) -> None:
    """`src` copied as `dst` (which must not exist) like `cp -a`, its failures typed: a full disk
    is DiskFull (retryable), anything else RuntimeFailure naming the path."""
    treecp = _treecp()
    if treecp is not None:
        proc = _run([treecp, str(src), str(dst)], src)
        if proc.returncode != _TREECP_UNSUPPORTED:
            return _check(proc, src, treecp=True)
        log.info("%s: %s; copying with cp -a", TREECP_NAME, proc.stderr.decode(errors="replace").strip())
        _remove(dst)
    _check(_run(["cp", "-a", "--no-target-directory", str(src), str(dst)], src), src)


def _run(argv: list[str], src: Path) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(argv, capture_output=True, timeout=COPY_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise RuntimeFailure(f"copying {src} took over {COPY_TIMEOUT:.0f} s", path=str(src)) from None


def _check(proc: subprocess.CompletedProcess[bytes], src: Path, treecp: bool = False) -> None:
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace")[-500:]
        full = proc.returncode == _TREECP_FULL if treecp else ("No space left on device" in err or
                                                               "Disk quota exceeded" in err)
        if full:
            raise DiskFull(f"copying {src}: the node's disk is full")
        raise RuntimeFailure(f"copying {src} failed: {err}", path=str(src))


def unshift_tree(root: Path, base: int) -> int:
    """Owners inside a user-namespaced environment's id range (host `base`..) back to what the
    environment sees (0..), in place; the entries changed. A tree deeper than Python's
    recursion limit is a RuntimeFailure."""
    try:
        paths = [str(root)] + [os.path.join(d, n) for d, dirs, files in os.walk(root) for n in (*dirs, *files)]
    except RecursionError:
        raise RuntimeFailure(f"{root} is nested too deep to shift its owners", path=str(root)) from None
    changed = 0
    for path in paths:
        st = os.lstat(path)
        uid = st.st_uid - base if st.st_uid >= base else st.st_uid
        gid = st.st_gid - base if st.st_gid >= base else st.st_gid
        if (uid, gid) != (st.st_uid, st.st_gid):
            os.lchown(path, uid, gid)
            changed += 1
    return changed
