"""Directory or tarball -> layer blob. Streams: memory never grows with the payload.

Sources: a directory (walked in sorted order), `.tar`, `.tar.gz`/`.tgz` (also bz2/xz) and
`.tar.zst`, detected by magic bytes, not by name. OCI layer semantics: `.wh.NAME` becomes a
whiteout entry, `.wh..wh..opq` marks its directory opaque. Directories that are overlayfs upper
dirs are understood too: a 0:0 character device is a whiteout, `trusted.overlay.opaque=y` marks
an opaque directory. The output is written to a temp file next to DST and renamed into place,
so DST is either the complete blob or untouched.
"""

from __future__ import annotations

import base64
import io
import os
import stat
import tarfile
import tempfile
import urllib.parse
import zlib
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from lzma import LZMAError
from pathlib import Path
from dataclasses import replace
from typing import BinaryIO, Protocol, TypedDict

import zstandard

from rollstack.errors import DiskFull, InvalidRequest, RollstackError, SourceInvalid, UnsafePath, is_disk_full
from rollstack.format import paths as layer_paths
from rollstack.format.toc import EntryType, TocEntry
from rollstack.format.tarheader import FastTarInfo
from rollstack.format.tarstream import Forward, decompressing, drain
from rollstack.format.writer import DEFAULT_CHUNK_SIZE, DEFAULT_LEVEL, LayerInfo, LayerWriter, Readable

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
OVERLAY_OPAQUE_XATTR = "trusted.overlay.opaque"
_MAX_U32 = (1 << 32) - 1
_I64 = (-(1 << 63), (1 << 63) - 1)
_READ_BUF = 1 << 20


class _Meta(TypedDict):
    """The metadata every entry carries, from a tar header or a stat."""

    mode: int
    uid: int
    gid: int
    mtime_ns: int


def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], *,
            chunk_size: int = DEFAULT_CHUNK_SIZE, level: int = DEFAULT_LEVEL,
            threads: int | None = None) -> LayerInfo:
    """Convert SRC (directory or tarball) into the layer blob DST (atomically)."""
    src, dst = Path(src), Path(dst)
    if not src.exists():
        raise SourceInvalid(f"{src}: no such file or directory")
    if not src.is_dir() and not src.is_file():
        raise SourceInvalid(f"{src}: not a directory or a tarball")
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    except OSError as exc:
        raise InvalidRequest(f"cannot write {dst}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb", buffering=_READ_BUF) as out:
            if src.is_dir():
                info = convert_dir(src, out, chunk_size=chunk_size, level=level, threads=threads)
            else:
                try:
                    f = open(src, "rb", buffering=0)
                except OSError as exc:
                    raise SourceInvalid(f"cannot read {src}: {exc.strerror or exc}") from None
                with f:
                    info = convert_tar(f, out, chunk_size=chunk_size, level=level, threads=threads)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dst)
        return info
    except OSError as exc:  # writing DST (full disk, DST is a directory...)
        _unlink(tmp)
        if is_disk_full(exc):
            raise DiskFull(f"cannot write {dst}: {exc.strerror}") from None
        raise InvalidRequest(f"cannot write {dst}: {exc.strerror or exc}") from None
    except BaseException:
        _unlink(tmp)
        raise


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def convert_fileobj(tar_stream: BinaryIO, out: BinaryIO, *, chunk_size: int = DEFAULT_CHUNK_SIZE,
                    level: int = DEFAULT_LEVEL, threads: int | None = None) -> LayerInfo:
    """Alias of `convert_tar` (e.g. an OCI image layer streamed from a registry)."""
    return convert_tar(tar_stream, out, chunk_size=chunk_size, level=level, threads=threads)


def default_threads() -> int:
    """Chunk workers (digest + zstd) beside the thread parsing the tar: one per core, at most 4."""
    return max(1, min(4, os.cpu_count() or 1))


class Lower(Protocol):
    """What the layers below an image layer have (`group import` knows them, see `convert_tar`)."""

    def __call__(self, path: str) -> TocEntry | None:
        """The entry at `path` in the merged lower layers (a hardlink as its target), or None."""
        ...

    def payload(self, entry: TocEntry) -> Readable:
        """A regular file's bytes (an entry `__call__` returned)."""
        ...


def convert_tar(tar_stream: BinaryIO, out: BinaryIO, *, chunk_size: int = DEFAULT_CHUNK_SIZE,
                level: int = DEFAULT_LEVEL, threads: int | None = None, lower: Lower | None = None) -> LayerInfo:
    """A (maybe compressed) tar stream, read once front to back -> a layer blob written to `out`.

    gzip is decoded off this thread (format/tarstream.py: a pigz child, or zlib on a thread);
    chunks are digested and compressed on `threads` workers (default: one per core); the blob
    is byte-identical for any thread count (see format/pipeline.py).

    `lower` lets an image layer hardlink to a file only a lower layer has (Docker and containerd
    allow it: the link is made in the unpacked tree): that file is copied into this layer at its
    path, with its metadata, and the hardlink points at the copy, which is exactly the upper
    layer overlayfs gets when containerd links a lower file (copy-up, then link)."""
    writer = LayerWriter(out, chunk_size=chunk_size, level=level,
                         threads=default_threads() if threads is None else threads)
    member = "<archive start>"
    try:
        with decompressing(tar_stream) as stream:
            reader = Forward(stream)
            tf = tarfile.open(fileobj=reader, mode="r:", tarinfo=FastTarInfo)  # type: ignore[call-overload]  # forward seeks only
            while True:
                ti = tf.next()
                if ti is None:
                    break
                member = ti.name
                _add_tar_member(writer, tf, reader, ti, lower)
                tf.members.clear()  # O(1) memory per member: we never look members up again
            member = "<archive end>"
            drain(reader)
            stream.check()
        return writer.finish(existing_dir=lower)
    except RollstackError:
        raise
    except (tarfile.TarError, EOFError, zlib.error, zstandard.ZstdError, OSError, ValueError, LZMAError) as exc:
        raise SourceInvalid(f"corrupt or truncated archive near entry {member!r}: {exc or type(exc).__name__}") from None
    finally:
        writer.close()


def _add_tar_member(writer: LayerWriter, tf: tarfile.TarFile, reader: Forward, ti: tarfile.TarInfo,
                    lower: Lower | None = None) -> None:
    path = layer_paths.normalize(ti.name)
    name = path.rsplit("/", 1)[-1]
    if name == OPAQUE_MARKER:
        writer.mark_opaque(layer_paths.parent(path))
        return
    common = _Meta(mode=ti.mode & 0o7777, uid=_u32(ti.uid, "uid", path), gid=_u32(ti.gid, "gid", path),
                  mtime_ns=_tar_mtime_ns(ti, path))
    if name.startswith(WHITEOUT_PREFIX):
        target = name[len(WHITEOUT_PREFIX):]
        if target in ("", ".", ".."):
            raise UnsafePath(f"whiteout {path!r} names no valid entry")
        parent = layer_paths.parent(path)
        writer.add(TocEntry(f"{parent}/{target}" if parent else target, EntryType.WHITEOUT, **common))
        return
    xattrs = _pax_xattrs(ti.pax_headers, path)
    if ti.isdir():
        writer.add(TocEntry(path, EntryType.DIR, xattrs=xattrs, **common))
    elif ti.issym():
        writer.add(TocEntry(path, EntryType.SYMLINK, link=ti.linkname, xattrs=xattrs, **common))
    elif ti.islnk():
        if lower is not None:
            _copy_up(writer, lower, layer_paths.normalize(ti.linkname, what=f"hardlink target of {path!r}"))
        writer.add(TocEntry(path, EntryType.HARDLINK, link=ti.linkname, xattrs=xattrs, **common))
    elif ti.ischr() or ti.isblk():
        etype = EntryType.CHAR if ti.ischr() else EntryType.BLOCK
        writer.add(TocEntry(path, etype, rdev_major=_u32(ti.devmajor, "devmajor", path),
                            rdev_minor=_u32(ti.devminor, "devminor", path), xattrs=xattrs, **common))
    elif ti.isfifo():
        writer.add(TocEntry(path, EntryType.FIFO, xattrs=xattrs, **common))
    else:  # regular (and, as POSIX says, any unknown type)
        f = _Payload(reader, ti.offset_data, ti.size) if ti.sparse is None else tf.extractfile(ti)
        entry = writer.add(TocEntry(path, EntryType.REG, xattrs=xattrs, **common), f or io.BytesIO())
        if entry.size != ti.size:
            raise SourceInvalid(f"entry {path!r}: archive is truncated ({entry.size} of {ti.size} bytes)")


class _Payload:
    """A regular member's bytes read straight off the forward stream: tarfile's `extractfile`
    stacks a BufferedReader and a Python `readinto` on every read of every member, which is
    most of the cost of a small file. Sparse members still go through tarfile."""

    def __init__(self, stream: Forward, start: int, size: int) -> None:
        stream.seek(start)  # forward only, and a no-op: the header was just read
        self._stream, self._left = stream, size

    def read(self, n: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        n = self._left if n < 0 else min(n, self._left)
        data = self._stream.read(n)
        self._left = self._left - len(data) if len(data) == n else 0  # short: the archive ended
        return data


def _copy_up(writer: LayerWriter, lower: Lower, target: str) -> None:
    """A hardlink's target that this layer lacks but a lower layer has: copy it up first."""
    if writer.has(target):
        return
    entry = lower(target)
    if entry is None or entry.type in (EntryType.DIR, EntryType.WHITEOUT):
        return  # not a file below either: the writer rejects the hardlink, naming it
    writer.add(replace(entry, path=target, chunks=[]), lower.payload(entry) if entry.type is EntryType.REG else None)


def _tar_mtime_ns(ti: tarfile.TarInfo, path: str) -> int:
    raw = ti.pax_headers.get("mtime")
    try:
        ns = int(Decimal(raw) * 1_000_000_000) if raw is not None else int(ti.mtime) * 1_000_000_000
    except (InvalidOperation, ValueError, OverflowError):
        raise SourceInvalid(f"entry {path!r} has an invalid mtime {raw!r}") from None
    if not _I64[0] <= ns <= _I64[1]:
        raise SourceInvalid(f"entry {path!r} has an out-of-range mtime")
    return ns


def _u32(v: int, what: str, path: str) -> int:
    if not 0 <= v <= _MAX_U32:
        raise SourceInvalid(f"entry {path!r} has an out-of-range {what} {v}")
    return v


def _pax_xattrs(pax: Mapping[str, str], path: str) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for key, value in pax.items():
        if key.startswith("SCHILY.xattr."):
            out[key[len("SCHILY.xattr."):]] = value.encode("utf-8", "surrogateescape")
        elif key.startswith("LIBARCHIVE.xattr."):
            try:
                name = urllib.parse.unquote(key[len("LIBARCHIVE.xattr."):])
                out[name] = base64.b64decode(value + "=" * (-len(value) % 4), validate=True)
            except ValueError:
                raise SourceInvalid(f"entry {path!r} has an undecodable xattr {key!r}") from None
    return out


# -- directories --------------------------------------------------------------------------

def convert_dir(root: str | os.PathLike[str], out: BinaryIO, *, chunk_size: int = DEFAULT_CHUNK_SIZE,
                level: int = DEFAULT_LEVEL, threads: int | None = None) -> LayerInfo:
    """A directory tree, walked depth-first in sorted name order -> a layer blob on `out`."""
    root = os.fspath(root)
    writer = LayerWriter(out, chunk_size=chunk_size, level=level,
                         threads=default_threads() if threads is None else threads)
    try:
        return _walk_dir(root, writer)
    finally:
        writer.close()


def _walk_dir(root: str, writer: LayerWriter) -> LayerInfo:
    seen_inodes: dict[tuple[int, int], str] = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        full = os.path.join(root, rel) if rel else root
        try:
            st = os.stat(full) if not rel else os.lstat(full)  # the root itself may be a symlink
        except OSError as exc:
            raise SourceInvalid(f"cannot stat {full}: {exc.strerror}") from None
        if stat.S_ISDIR(st.st_mode):
            _add_dir_entry(writer, full, rel, st)
            try:
                names = sorted(os.listdir(full))
            except OSError as exc:
                raise SourceInvalid(f"cannot list {full}: {exc.strerror}") from None
            stack.extend(f"{rel}/{n}" if rel else n for n in reversed(names))
        else:
            _add_dir_leaf(writer, full, rel, st, seen_inodes)
    return writer.finish()


def _fs_xattrs(full: str) -> dict[str, bytes]:
    try:
        names = os.listxattr(full, follow_symlinks=False)
        return {n: os.getxattr(full, n, follow_symlinks=False) for n in sorted(names)}
    except OSError:  # filesystems without xattr support, or a racing delete
        return {}


def _common(st: os.stat_result) -> _Meta:
    return _Meta(mode=stat.S_IMODE(st.st_mode), uid=st.st_uid, gid=st.st_gid, mtime_ns=st.st_mtime_ns)


def _add_dir_entry(writer: LayerWriter, full: str, rel: str, st: os.stat_result) -> None:
    xattrs = _fs_xattrs(full)
    if xattrs.pop(OVERLAY_OPAQUE_XATTR, None) == b"y":
        writer.mark_opaque(rel)
    writer.add(TocEntry(rel, EntryType.DIR, xattrs=xattrs, **_common(st)))


def _add_dir_leaf(writer: LayerWriter, full: str, rel: str, st: os.stat_result,
                  seen_inodes: dict[tuple[int, int], str]) -> None:
    name = rel.rsplit("/", 1)[-1]
    parent = layer_paths.parent(rel)
    if name == OPAQUE_MARKER:
        writer.mark_opaque(parent)
        return
    if name.startswith(WHITEOUT_PREFIX):
        target = name[len(WHITEOUT_PREFIX):]
        if target in ("", ".", ".."):
            raise UnsafePath(f"whiteout {rel!r} names no valid entry")
        writer.add(TocEntry(f"{parent}/{target}" if parent else target, EntryType.WHITEOUT, **_common(st)))
        return
    mode = st.st_mode
    if stat.S_ISCHR(mode) and st.st_rdev == 0:  # overlayfs whiteout
        writer.add(TocEntry(rel, EntryType.WHITEOUT, **_common(st)))
        return
    if stat.S_ISSOCK(mode):  # sockets are runtime state, not layer content (tar skips them too)
        return
    if st.st_nlink > 1:
        key = (st.st_dev, st.st_ino)
        first = seen_inodes.get(key)
        if first is not None:
            writer.add(TocEntry(rel, EntryType.HARDLINK, link=first, **_common(st)))
            return
        seen_inodes[key] = rel
    xattrs = _fs_xattrs(full)
    if stat.S_ISREG(mode):
        try:
            f = open(full, "rb", buffering=0)
        except OSError as exc:
            raise SourceInvalid(f"cannot read {full}: {exc.strerror}") from None
        with f:
            writer.add(TocEntry(rel, EntryType.REG, xattrs=xattrs, **_common(st)), f)
    elif stat.S_ISLNK(mode):
        try:
            target = os.readlink(full)
        except OSError as exc:
            raise SourceInvalid(f"cannot read symlink {full}: {exc.strerror}") from None
        writer.add(TocEntry(rel, EntryType.SYMLINK, link=target, xattrs=xattrs, **_common(st)))
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        etype = EntryType.CHAR if stat.S_ISCHR(mode) else EntryType.BLOCK
        writer.add(TocEntry(rel, etype, rdev_major=os.major(st.st_rdev), rdev_minor=os.minor(st.st_rdev),
                            xattrs=xattrs, **_common(st)))
    elif stat.S_ISFIFO(mode):
        writer.add(TocEntry(rel, EntryType.FIFO, xattrs=xattrs, **_common(st)))
    else:
        raise SourceInvalid(f"{full}: unsupported file type {stat.filemode(mode)}")
