"""`LazyFS`: the pyfuse3 operations of the lazy layer store (read-only).

Namespace:

    /                       inode 1
    /layers/                inode 2, one directory per loaded layer
    /layers/<digest-hex>/   the layer's root; its tree is the layer's TOC, overlay-ready:
                            whiteouts are 0/0 character devices, opaque directories answer
                            getxattr("trusted.overlay.opaque") with b"y"
    /blobs/                 inode 3
    /blobs/<digest-hex>     the layer's EROFS data blob (format/erofs.py): its files' bytes,
                            each from a 4 KiB boundary; the device of the layer's EROFS image
                            (lowers/erofs.py), read on demand like the files it is cut from

Layers are immutable, so entries, attributes and negative lookups inside them carry long
timeouts, opened files keep their page cache (`keep_cache`) and symlink targets are cached.
`/` and `/layers` change when layers are added, so they get short timeouts, uncached negative
lookups, and /layers an mtime that moves with each added layer (the kernel drops its cached
listing when the mtime changes).

No-open mode (`DaemonConfig.no_open`, with the patched pyfuse3 of third_party/pyfuse3): the first
OPEN and the first OPENDIR are answered ENOSYS. From then on the kernel sends no OPEN, RELEASE,
OPENDIR or RELEASEDIR at all, keeps page caches, and caches directory listings; reads arrive as
`read_unopened(inode, ...)` and readdirs with the inode as fh. That removes four FUSE requests
per opened file (two per directory) from every warm start. The mount is read-only (`ro`), so
the write-open checks of `open` are enforced by the VFS before FUSE is asked.

Errors are translated in exactly one place, `_translate`: RollstackError/OSError -> errno.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat
from typing import Any, Callable

import pyfuse3

from rollstack.errors import FormatError, NotFound, RegistryError, RollstackError
from rollstack.fetch.fetcher import leaf_error
from rollstack.format.toc import EntryType
from rollstack.lazystore.index import entry_size, mode_bits, rdev
from rollstack.lazystore.service import LazyStoreService

log = logging.getLogger("rollstack.lazystore.fs")

ROOT = pyfuse3.ROOT_INODE
LAYERS = 2
BLOBS = 3
_BLOB_FH = 1 << 62  # kernel-open mode: file handles of /blobs files (Reads' handles stay below)
OPAQUE_XATTR = b"trusted.overlay.opaque"
_SHORT = 1.0
PATCH_LEVEL = getattr(pyfuse3, "ROLLSTACK_PATCH", 0)  # third_party/pyfuse3; 0: a stock pyfuse3
PATCHED = PATCH_LEVEL >= 1  # no-open mode (level 2 adds the fd-holder handover, lazystore/daemon.py)
XATTR_FAST = PATCH_LEVEL >= 3  # getxattr/listxattr of inodes without xattrs answered in C
LINGER = PATCH_LEVEL >= 4  # the fast path waits briefly for the next request (fuse_linger_us)
# ROLLSTACK_XATTR_FAST=0 turns the fast path off (A/B measurements: `rollstack bench exec`)
_XATTR_FAST_ON = XATTR_FAST and os.environ.get("ROLLSTACK_XATTR_FAST", "1") != "0"


def _errno_of(exc: BaseException) -> int:
    if isinstance(exc, pyfuse3.FUSEError):
        return exc.errno
    if isinstance(exc, NotFound):
        return errno.ENOENT
    if isinstance(exc, (FormatError, RegistryError)):
        return errno.EIO  # integrity failure, registry gone past the deadline
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno
    return errno.EIO


def _translate(fn: Callable) -> Callable:
    """The one place where exceptions become errnos."""

    name = fn.__name__

    @functools.wraps(fn)
    async def op(self: "LazyFS", *args: Any) -> Any:
        self.ops[name] = self.ops.get(name, 0) + 1
        try:
            return await fn(self, *args)
        except pyfuse3.FUSEError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bug must not take the mount down
            err = leaf_error(exc)
            if not isinstance(err, (RollstackError, OSError)):
                log.exception("%s%r failed", name, args[:2])
                raise pyfuse3.FUSEError(errno.EIO) from None
            code = _errno_of(err)
            if code == errno.EIO:
                log.warning("%s%r -> EIO: %s", name, args[:2], err)
            raise pyfuse3.FUSEError(code) from None

    return op


class LazyFS(pyfuse3.Operations):
    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False
    enable_cache_symlinks = True  # read by the patched pyfuse3 only

    def __init__(self, service: LazyStoreService) -> None:
        super().__init__()
        self.svc = service
        self.layers = service.layers
        self.reads = service.reads
        self.timeout = service.config.entry_timeout
        self.no_open = service.config.no_open and PATCHED
        self.mode: dict[str, Any] = {"no_open": self.no_open, "patched_pyfuse3": PATCHED,
                                     "xattr_fast_path": _XATTR_FAST_ON}
        if _XATTR_FAST_ON:
            pyfuse3.set_no_xattr_ranges([])  # a fresh process: nothing declared yet
        if LINGER:
            linger = service.config.fuse_linger_us if _XATTR_FAST_ON else 0
            pyfuse3.set_fast_linger(linger)
            self.mode["fuse_linger_us"] = linger
        self.lookups: dict[int, int] = {}
        self.ops: dict[str, int] = {}  # FUSE requests served, by operation
        self._xattr_keys: dict[bytes, str] = {}  # xattr name -> its ops counter key

    # -- what the service reads from us (service.Frontend) ----------------------------------
    def fast_stats(self) -> dict[str, int] | None:
        return pyfuse3.fast_path_stats() if _XATTR_FAST_ON else None

    def no_xattr_hook(self) -> Callable[[list[tuple[int, int]], frozenset[int]], None] | None:
        return pyfuse3.set_no_xattr_ranges if _XATTR_FAST_ON else None

    def activity(self) -> int:
        """FUSE requests served so far (the fetcher's write-back waits until it stops moving)."""
        return sum(self.ops.values())

    def note_mode(self, **facts: Any) -> None:
        """How the daemon set this mount up (takeover, fd-holder, FUSE thread priority)."""
        self.mode.update(facts)

    # -- attributes ------------------------------------------------------------------------
    def _dir_attr(self, ino: int, nlink: int, mtime_ns: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.st_mode = stat.S_IFDIR | 0o755
        a.st_nlink = nlink
        a.st_size = 4096
        a.st_blksize = 4096
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = mtime_ns
        a.entry_timeout = a.attr_timeout = _SHORT
        return a

    def _attr(self, ino: int) -> pyfuse3.EntryAttributes:
        if ino == ROOT:
            return self._dir_attr(ROOT, 4, int(self.svc.started * 1e9))
        if ino == LAYERS:
            return self._dir_attr(LAYERS, 2 + len(self.layers), self.layers.changed_ns)
        if ino == BLOBS:
            return self._dir_attr(BLOBS, 2, self.layers.changed_ns)
        layer = self.layers.of_inode(ino)
        if layer is None:
            blob = self.layers.of_blob_inode(ino)
            if blob is None or blob.blob_map is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._blob_attr(blob)
        idx = layer.index
        e = idx.entry(ino)
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.st_mode = mode_bits(e)
        a.st_nlink = idx.nlink(ino)
        a.st_uid, a.st_gid = e.uid, e.gid
        a.st_rdev = rdev(e)
        a.st_size = entry_size(e)
        a.st_blksize = 4096
        a.st_blocks = (a.st_size + 511) // 512
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = e.mtime_ns
        a.entry_timeout = a.attr_timeout = self.timeout
        return a

    def _blob_attr(self, layer: Any) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = layer.blob_inode
        a.st_mode = stat.S_IFREG | 0o444
        a.st_nlink = 1
        a.st_size = layer.blob_map.size
        a.st_blksize = 4096
        a.st_blocks = (a.st_size + 511) // 512
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = int(self.svc.started * 1e9)
        a.entry_timeout = a.attr_timeout = self.timeout
        return a

    def _counted(self, a: pyfuse3.EntryAttributes) -> pyfuse3.EntryAttributes:
        self.lookups[a.st_ino] = self.lookups.get(a.st_ino, 0) + 1
        return a

    # -- namespace -------------------------------------------------------------------------
    @_translate
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        n = os.fsdecode(name)
        if n == ".":
            return self._counted(self._attr(parent_inode))
        if parent_inode == ROOT:
            if n == "layers":
                return self._counted(self._attr(LAYERS))
            if n == "blobs":
                return self._counted(self._attr(BLOBS))
            if n == "..":
                return self._counted(self._attr(ROOT))
            raise pyfuse3.FUSEError(errno.ENOENT)
        if parent_inode == BLOBS:
            if n == "..":
                return self._counted(self._attr(ROOT))
            layer = self.layers.get(n)
            if layer is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            await self.layers.blob_map(layer)
            return self._counted(self._blob_attr(layer))
        if parent_inode == LAYERS:
            if n == "..":
                return self._counted(self._attr(ROOT))
            layer = self.layers.get(n)
            if layer is None:  # not cached: the layer may be added a moment later
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._counted(self._attr(layer.index.root))
        layer = self.layers.of_inode(parent_inode)
        if layer is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        idx = layer.index
        if n == "..":
            target = LAYERS if parent_inode == idx.root else idx.parent(parent_inode)
            return self._counted(self._attr(target))
        ino = idx.child(parent_inode, n)
        if ino is None:
            neg = pyfuse3.EntryAttributes()
            neg.st_ino = 0
            neg.entry_timeout = self.timeout  # cached negative lookup: the layer never changes
            return neg
        return self._counted(self._attr(ino))

    @_translate
    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        return self._attr(inode)

    @_translate
    async def readlink(self, inode: int, ctx: Any) -> bytes:
        layer = self.layers.of_inode(inode)
        if layer is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        e = layer.index.entry(inode)
        if e.type is not EntryType.SYMLINK:
            raise pyfuse3.FUSEError(errno.EINVAL)
        return os.fsencode(e.link)

    def forget(self, inode_list: list[tuple[int, int]]) -> None:
        for ino, n in inode_list:
            left = self.lookups.get(ino, 0) - n
            if left > 0:
                self.lookups[ino] = left
            else:
                self.lookups.pop(ino, None)

    # -- directories -----------------------------------------------------------------------
    @_translate
    async def opendir(self, inode: int, ctx: Any) -> int:
        if self.no_open:
            raise pyfuse3.FUSEError(errno.ENOSYS)  # no more OPENDIR/RELEASEDIR; readdir gets the inode
        if inode in (ROOT, LAYERS, BLOBS):
            return inode
        layer = self.layers.of_inode(inode)
        if layer is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if layer.index.entry(inode).type is not EntryType.DIR:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    def _listing(self, fh: int) -> list[tuple[str, int]]:
        if fh == ROOT:
            return [("layers", LAYERS), ("blobs", BLOBS)]
        if fh == BLOBS:  # only the blobs asked for (looked up) so far have attributes to list
            return [(h, layer.blob_inode) for h, layer in sorted(self.layers.items()) if layer.blob_map is not None]
        if fh == LAYERS:
            return [(h, layer.index.root) for h, layer in sorted(self.layers.items())]
        layer = self.layers.of_inode(fh)
        return layer.index.children(fh) if layer is not None else []

    @_translate
    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        entries = self._listing(fh)
        for i in range(start_id, len(entries)):
            name, ino = entries[i]
            if not pyfuse3.readdir_reply(token, os.fsencode(name), self._attr(ino), i + 1):
                return
            self.lookups[ino] = self.lookups.get(ino, 0) + 1

    async def releasedir(self, fh: int) -> None:
        return None

    # -- files -----------------------------------------------------------------------------
    @_translate
    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise pyfuse3.FUSEError(errno.EROFS)
        layer = self.layers.of_inode(inode)
        if layer is None:
            if self.layers.of_blob_inode(inode) is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            if self.no_open:
                raise pyfuse3.FUSEError(errno.ENOSYS)
            return pyfuse3.FileInfo(fh=_BLOB_FH | inode, keep_cache=True)
        if layer.index.entry(inode).type is not EntryType.REG:
            raise pyfuse3.FUSEError(errno.EISDIR if layer.index.entry(inode).type is EntryType.DIR else errno.EACCES)
        if self.no_open:
            raise pyfuse3.FUSEError(errno.ENOSYS)  # no more OPEN/RELEASE; reads come as read_unopened
        fh = self.reads.open_file(inode, ctx.pid if ctx is not None else 0)
        return pyfuse3.FileInfo(fh=fh, keep_cache=True)

    @_translate
    async def read(self, fh: int, off: int, size: int) -> bytes:
        if fh & _BLOB_FH:
            return await self._read_blob(fh & ~_BLOB_FH, off, size, 0)
        return await self.reads.read(fh, off, size)

    @_translate
    async def read_unopened(self, inode: int, off: int, size: int, ctx: Any) -> bytes:
        pid = ctx.pid if ctx is not None else 0
        if self.layers.of_inode(inode) is None:
            return await self._read_blob(inode, off, size, pid)
        return await self.reads.read_unopened(inode, off, size, pid)

    async def _read_blob(self, inode: int, off: int, size: int, pid: int) -> bytes:
        layer = self.layers.of_blob_inode(inode)
        if layer is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return await self.reads.read_blob(layer, await self.layers.blob_map(layer), off, size, pid)

    async def release(self, fh: int) -> None:
        if not fh & _BLOB_FH:
            self.reads.release(fh)

    # -- xattrs ----------------------------------------------------------------------------
    def _xattrs(self, inode: int) -> dict[bytes, bytes]:
        layer = self.layers.of_inode(inode)
        if layer is None:
            return {}
        e = layer.index.entry(inode)
        out = {os.fsencode(k): v for k, v in e.xattrs.items()}
        if e.type is EntryType.DIR and e.opaque:
            out[OPAQUE_XATTR] = b"y"
        return out

    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        """The hottest cold-start request after lookup: overlayfs asks every lower file for
        `trusted.overlay.metacopy` (and directories for opaque/redirect/...) and the kernel does
        not cache xattr answers, negative or not. So: no wrapper, no dict building; ENODATA
        unless the TOC has the name (or it is the opaque marker of an opaque directory)."""
        ops = self.ops
        ops["getxattr"] = ops.get("getxattr", 0) + 1
        ops_name = self._xattr_keys.get(name)
        if ops_name is None:
            ops_name = self._xattr_keys[name] = "getxattr:" + name.decode(errors="replace")
        ops[ops_name] = ops.get(ops_name, 0) + 1
        layer = self.layers.of_inode(inode)
        if layer is not None:
            try:
                e = layer.index.entry(inode)
            except Exception:  # noqa: BLE001 - an inode outside its layer: no such attribute
                raise pyfuse3.FUSEError(pyfuse3.ENOATTR) from None
            if name == OPAQUE_XATTR:
                if e.type is EntryType.DIR and e.opaque:
                    return b"y"
            if e.xattrs:
                value = e.xattrs.get(os.fsdecode(name))
                if value is not None:
                    return value
        raise pyfuse3.FUSEError(pyfuse3.ENOATTR)

    @_translate
    async def listxattr(self, inode: int, ctx: Any) -> list[bytes]:
        return list(self._xattrs(inode))

    # -- filesystem ------------------------------------------------------------------------
    @_translate
    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        s = pyfuse3.StatvfsData()
        total = sum(layer.blob_size for layer in self.layers)
        s.f_bsize = s.f_frsize = 4096
        s.f_blocks = total // 4096
        s.f_bfree = s.f_bavail = 0
        s.f_files = sum(layer.index.size for layer in self.layers) + 2
        s.f_ffree = s.f_favail = 0
        s.f_namemax = 255
        return s
