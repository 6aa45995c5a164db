"""User namespaces for runc environments (`security: {userns: true}`, opt-in).

Root inside maps to host uid/gid `HOST_BASE` (100000), 65536 ids, one range per node (every
environment of the node shares it; a per-environment range is future work). Files keep their
owners inside through **idmapped layers**: each lower directory is cloned as an idmapped mount
(host 0 -> 100000, ...) under `<env>/idmap/<i>` and the overlay stacks those; the upper is a
plain directory whose root is owned by 100000, so the environment's writes land in it with
mapped owners on disk (root's files as 100000, uid 1000's as 101000). The diff does not carry
owners, so diff/evaluate are unchanged.

Measured on kernel 6.18 (docs/runtime.md "User namespaces"): the merged overlay itself cannot
be idmapped (EINVAL), an idmapped *upper* makes overlayfs fall back to read-only (EOVERFLOW
creating its work dir as host root), idmapped lowers work. Lowers served by the lazy store's
FUSE daemon cannot be idmapped (the FUSE server would have to opt in): such a plan fails with a
`runtime_error` naming `security.userns` (materialized layers are local dirs and work).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import threading
import time
from pathlib import Path

from rollstack.errors import RuntimeFailure

HOST_BASE = 100000
SIZE = 65536

_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442  # x86_64 and arm64 alike
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC = 1, 0o2000000
_AT_FDCWD, _AT_EMPTY_PATH = -100, 0x1000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOUNT_ATTR_IDMAP = 0x00100000

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


class IdMap:
    """A user namespace carrying the node's mapping, held open by fd (made on first use)."""

    def __init__(self, base: int = HOST_BASE, size: int = SIZE) -> None:
        self.base, self.size = base, size
        self._fd: int | None = None
        self._lock = threading.Lock()

    def fd(self) -> int:
        with self._lock:
            if self._fd is None:
                self._fd = _make_userns(self.base, self.size)
            return self._fd

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def mount(self, src: Path, dst: Path) -> None:
        """An idmapped clone of directory `src` at `dst` (an empty directory)."""
        fd = _libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, os.fsencode(src),
                           _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC)
        if fd < 0:
            raise _err("open_tree", src)
        try:
            attr = _MountAttr(_MOUNT_ATTR_IDMAP, 0, 0, self.fd())
            if _libc.syscall(_SYS_MOUNT_SETATTR, fd, b"", _AT_EMPTY_PATH, ctypes.byref(attr),
                             ctypes.sizeof(attr)) < 0:
                raise _err("idmapping", src)
            if _libc.syscall(_SYS_MOVE_MOUNT, fd, b"", _AT_FDCWD, os.fsencode(dst),
                             _MOVE_MOUNT_F_EMPTY_PATH) < 0:
                raise _err("move_mount", src)
        finally:
            os.close(fd)


def _err(what: str, path: Path) -> RuntimeFailure:
    e = ctypes.get_errno()
    hint = " (a lazy-store FUSE layer cannot be idmapped; only local layers can)" \
        if e in (22, 1) else ""
    return RuntimeFailure(f"security.userns: {what} of layer {path} failed: {os.strerror(e)}{hint}")


def _make_userns(base: int, size: int) -> int:
    """A user namespace with 0..size -> base..base+size, as an fd (its helper process is gone)."""
    child = subprocess.Popen(["unshare", "--user", "sh", "-c", "read _"], stdin=subprocess.PIPE)
    try:
        own = os.readlink("/proc/self/ns/user")
        end = time.monotonic() + 5
        while os.readlink(f"/proc/{child.pid}/ns/user") == own:  # until unshare has run
            if time.monotonic() > end or child.poll() is not None:
                raise RuntimeFailure("security.userns: cannot create a user namespace")
            time.sleep(0.002)
        Path(f"/proc/{child.pid}/uid_map").write_text(f"0 {base} {size}\n")
        Path(f"/proc/{child.pid}/setgroups").write_text("deny")
        Path(f"/proc/{child.pid}/gid_map").write_text(f"0 {base} {size}\n")
        return os.open(f"/proc/{child.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise RuntimeFailure(f"security.userns: cannot set up the id mapping: {e}") from None
    finally:
        child.kill()
        child.wait()


def check_traversable(path: Path) -> None:
    """The mapped root must be able to reach the rootfs: every parent needs o+x."""
    for parent in Path(path).parents:
        if parent.exists() and not os.stat(parent).st_mode & 0o001:
            raise RuntimeFailure(f"security.userns: {parent} is not searchable by others (mode "
                                 f"{oct(os.stat(parent).st_mode & 0o777)}); the mapped root "
                                 "could not reach the environment's root there")


def mappings(base: int = HOST_BASE, size: int = SIZE) -> list[dict[str, int]]:
    return [{"containerID": 0, "hostID": base, "size": size}]
