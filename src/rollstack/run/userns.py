"""User namespaces for runc environments: on by default where the node supports it
(`security: {userns: false}` opts out; `true` insists and fails when it cannot).

Root inside maps to host uid/gid `HOST_BASE` (100000), 65536 ids, one range per node (every
environment of the node shares it; a per-environment range is future work). Files keep their
owners inside through **shifted layers**: a lazy-store layer `<mnt>/layers/<hex>` is stacked as
its twin `<mnt>/shifted/<hex>`, the same files with owners reported +100000
(rollstack.lazystore.shift); a local (materialized) layer directory is cloned as an idmapped mount
(host 0 -> 100000, ...) under `<env>/idmap/<i>`. The overlay stacks those; the upper is a
plain directory whose root is owned by 100000, so the environment's writes land in it with
mapped owners on disk (root's files as 100000, uid 1000's as 101000). The diff does not carry
owners, so diff/evaluate are unchanged.

Measured on kernel 6.18 (docs/runtime.md "User namespaces"): the merged overlay itself cannot
be idmapped (EINVAL), an idmapped *upper* makes overlayfs fall back to read-only (EOVERFLOW
creating its work dir as host root), idmapped lowers work. Lowers served by the lazy store's
FUSE daemon cannot be idmapped (the server would have to set FUSE_ALLOW_IDMAP, libfuse >= 3.16),
hence the shifted view.

The mapped root must be able to walk to the rootfs (runc's init bind-mounts it from inside the
user namespace). When a parent of the environment dir is not searchable by others (pytest's
0700 tmp dirs), the merged rootfs is also bind-mounted at `/run/rollstack-userns/<hash>` and
runc is given that path (`publish_rootfs`; removed by `unpublish_rootfs` on destroy).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import stat
import subprocess
import threading
import time
from pathlib import Path

from rollstack.errors import RuntimeFailure
from rollstack.host import libc
from rollstack.host.fd import Fd
from rollstack.host.libc import libc as _libc
from rollstack.lazystore import shift

HOST_BASE = shift.BASE  # the lazy store's shifted view uses the same range
SIZE = shift.SIZE
PUBLIC = Path("/run/rollstack-userns")

_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442  # x86_64 and arm64 alike
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC = 1, 0o2000000
_AT_FDCWD, _AT_EMPTY_PATH = -100, 0x1000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOUNT_ATTR_IDMAP = 0x00100000



class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


class IdMap:
    """A user namespace carrying the node's mapping, held open by fd (made on first use).

    One per node, used by every create's thread: its descriptor is used only under the lock
    (`idmap`), never handed out as a number, so `close` cannot close it under a mount_setattr
    in flight (which would then pass a closed number, or another thread's reused one)."""

    def __init__(self, base: int = HOST_BASE, size: int = SIZE) -> None:
        self.base, self.size = base, size
        self._fd: Fd | None = None
        self._lock = threading.Lock()

    def idmap(self, tree: int) -> int:
        """mount_setattr(MOUNT_ATTR_IDMAP) of the detached mount `tree` with this namespace: the
        syscall's result (< 0: the errno is in ctypes.get_errno())."""
        with self._lock:
            if self._fd is None:
                self._fd = Fd(_make_userns(self.base, self.size), "userns of the id mapping")
            attr = _MountAttr(_MOUNT_ATTR_IDMAP, 0, 0, self._fd.fileno())
            return _libc.syscall(_SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH, ctypes.byref(attr),
                                 ctypes.sizeof(attr))

    def close(self) -> None:
        """Close the namespace's fd (idmapped mounts keep their own reference); a later `idmap`
        makes a new one."""
        with self._lock:
            fd, self._fd = self._fd, None
            if fd is not None:
                fd.close()

    def mount(self, src: Path, dst: Path) -> None:
        """An idmapped clone of directory `src` at `dst` (an empty directory)."""
        fd = _libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, os.fsencode(src),
                           _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC)
        if fd < 0:
            raise _err("open_tree", src)
        try:
            if self.idmap(fd) < 0:
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


def mappings(base: int = HOST_BASE, size: int = SIZE) -> list[dict[str, int]]:
    return [{"containerID": 0, "hostID": base, "size": size}]


def traversable(path: Path) -> bool:
    return all(not p.exists() or os.stat(p).st_mode & 0o001 for p in Path(path).parents)


_support: dict[str, str | None] = {}


def unsupported() -> str | None:
    """Why this node cannot run user-namespaced environments (None: it can). Probed once per
    process: make a user namespace and idmap a detached clone of /run with it."""
    if "why" not in _support:
        why = None
        try:
            probe = IdMap()
            try:
                fd = _libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, b"/run", _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC)
                if fd < 0:
                    why = f"open_tree: {os.strerror(ctypes.get_errno())}"
                else:
                    try:  # closed also when making the namespace fails (RuntimeFailure)
                        if probe.idmap(fd) < 0:
                            why = f"idmapped mounts: {os.strerror(ctypes.get_errno())}"
                    finally:
                        os.close(fd)
            finally:
                probe.close()
        except RuntimeFailure as e:
            why = str(e)
        _support["why"] = why
    return _support["why"]


def resolve(requested: bool | None, runtime: str) -> bool:
    """The plan's `security.userns` (None: the default) -> whether this environment gets one."""
    if requested is False:
        return False
    if runtime != "runc":
        if requested:
            raise RuntimeFailure(f"security.userns: not available with runtime: {runtime}")
        return False
    why = unsupported()
    if why is not None:
        if requested:
            raise RuntimeFailure(f"security.userns: this node does not support it ({why})")
        return False
    return True


def public_rootfs(env_dir: Path) -> Path:
    return PUBLIC / hashlib.sha256(os.fsencode(env_dir)).hexdigest()[:24]


def publish_rootfs(env_dir: Path, rootfs: Path) -> Path:
    """The path runc is given for the rootfs: `rootfs` itself when the mapped root can reach
    it, else a bind mount of it under /run/rollstack-userns (every parent searchable)."""
    if traversable(rootfs):
        return rootfs
    PUBLIC.mkdir(mode=0o711, exist_ok=True)
    os.chmod(PUBLIC, 0o711)
    dst = public_rootfs(env_dir)
    dst.mkdir(mode=0o755, exist_ok=True)
    e = libc.mount(os.fsencode(rootfs), dst, None, libc.MS_BIND)
    if e:
        raise RuntimeFailure(f"security.userns: bind-mounting {rootfs} at {dst}: {os.strerror(e)}")
    return dst


def unpublish_rootfs(env_dir: Path) -> None:
    """Undo `publish_rootfs` (repeatable; nothing to do when it used the rootfs itself)."""
    from rollstack.host.umount import unmount

    dst = public_rootfs(env_dir)
    try:  # every mount stacked there: a late-bound root's overlay propagates to it (run/lateroot)
        unmount(dst)
    except RuntimeFailure as e:
        raise RuntimeFailure(f"security.userns: unmounting {dst}: {e}") from e
    try:
        dst.rmdir()
    except FileNotFoundError:
        pass


def layer_view(lower: Path) -> Path | None:
    """A lazy-store lower's shifted twin (None: a local directory, to be idmapped)."""
    twin = shift.shifted_path(lower)
    return Path(twin) if twin is not None else None


def shift_upper(upper: Path, via: Path | None = None) -> int:
    """Give what the node wrote into `upper` as host root (the task mutation) the owners a
    user-namespaced root sees as its own: host id u -> BASE + u for ids outside the range
    (ids already inside it, e.g. copied-up layer files, stay). Returns entries changed.
    `via`: the mounted merged root; the entries found in `upper` are changed through it (an
    upper must not be written behind a mounted overlay: a started warm sandbox)."""
    changed = 0
    lo, hi = HOST_BASE, HOST_BASE + SIZE

    def walk(rel: str) -> None:
        nonlocal changed
        with os.scandir(os.path.join(upper, rel) if rel else upper) as it:
            for entry in it:
                # the owner read in the upper (an upper entry is what the merged view shows);
                # only an entry to change is touched, through `via`
                st = entry.stat(follow_symlinks=False)
                child = os.path.join(rel, entry.name) if rel else entry.name
                if not (lo <= st.st_uid < hi and lo <= st.st_gid < hi):
                    uid = st.st_uid if lo <= st.st_uid < hi else shift.shifted_ids(st.st_uid, 0)[0]
                    gid = st.st_gid if lo <= st.st_gid < hi else shift.shifted_ids(0, st.st_gid)[1]
                    path = os.path.join(upper if via is None else via, child)
                    os.lchown(path, uid, gid)
                    if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o6000:
                        os.chmod(path, st.st_mode & 0o7777)  # chown cleared setuid/setgid
                    changed += 1
                if stat.S_ISDIR(st.st_mode):
                    walk(child)

    walk("")
    return changed


def id_base_of(rootfs: Path) -> int:
    """HOST_BASE when `rootfs` (a merged root) belongs to a user-namespaced environment (its
    root dir is owned by the mapped range: the upper's root is chowned at create), else 0.
    For callers that hold only the path (the E2B filesystem API); `Environment.files` knows."""
    return HOST_BASE if HOST_BASE <= os.stat(rootfs).st_uid < HOST_BASE + SIZE else 0
