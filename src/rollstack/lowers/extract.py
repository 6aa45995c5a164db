"""Extract a rollstack layer blob straight into a directory (materialization without FUSE).

`extract_layer(read_range, blob_size, dst, chunk_cache=...)` reads the blob's TOC, creates the
tree (directories, files, symlinks, hardlinks, devices, fifos, whiteouts as 0/0 character devices,
opaque directories with `trusted.overlay.opaque=y`, xattrs, owners, modes incl. setuid, mtimes)
and fills the regular files by streaming the blob **once, in blob order**: chunks the node's disk
cache already holds (decompressed, content-addressed) are copied from there after a digest check;
the others are fetched in large range reads (`window`, 8 MiB), decompressed and verified exactly
like the lazy store's reads (`decode_chunk`). No byte goes through FUSE or the lazy store daemon.

The node runs it as its own process (`python -m rollstack.lowers.extract ...`, see
`spawn_args`): single-threaded (so at most one core), at nice 19 in the SCHED_IDLE class and
the idle I/O class, in the node's background cgroup (host.background: a CPU cap, default one
core, and the lowest share), so running environments always go first. The result equals the FUSE view of
the layer entry by entry (tests/integration/lowers/test_lowers_extract.py).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rollstack.errors import FormatError, IntegrityError
from rollstack.format.chunk import decode_chunk
from rollstack.format.reader import read_toc
from rollstack.format.toc import Chunk, EntryType, TocEntry
from rollstack.host import cpuidle
from rollstack.host.libc import die_with_spawner

WINDOW = 8 << 20  # bytes per range read of the blob
GAP = 256 << 10  # cached chunks shorter than this between two missing ones are fetched anyway
OPAQUE_XATTR = "trusted.overlay.opaque"


@dataclass
class ExtractStats:
    files: int = 0
    entries: int = 0
    bytes_written: int = 0
    fetched_bytes: int = 0
    requests: int = 0
    from_cache_bytes: int = 0
    seconds: float = 0.0
    paced_seconds: float = 0.0
    """Waited for idle CPU (`pace`) before reading or copying."""
    detail: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in ("files", "entries", "bytes_written", "fetched_bytes", "requests",
                                              "from_cache_bytes", "seconds", "paced_seconds")}


class _RangeSource:
    """`BlobSource` over a blocking `read_range(offset, length)`."""

    def __init__(self, read_range: Callable[[int, int], bytes], size: int) -> None:
        self._read, self._size = read_range, size

    def size(self) -> int:
        return self._size

    def read_at(self, offset: int, length: int) -> bytes:
        return self._read(offset, length)


def _cached(chunk_cache: Path | None, chunk: Chunk) -> bytes | None:
    """The chunk's bytes from the node's disk cache (`<dir>/sha256/<hh>/<hex>`), verified; else None."""
    if chunk_cache is None:
        return None
    hexd = chunk.digest.partition(":")[2]
    try:
        data = (chunk_cache / "sha256" / hexd[:2] / hexd).read_bytes()
    except OSError:
        return None
    if len(data) != chunk.size or hashlib.sha256(data).hexdigest() != hexd:
        return None  # a torn or bad cache file is never used; the registry has the bytes
    return data


def plan_ranges(chunks: list[Chunk], missing: set[int], *, window: int = WINDOW, gap: int = GAP) -> list[tuple[int, int]]:
    """Pure: range reads (offset, length) covering every chunk whose blob offset is in `missing`,
    in blob order; runs separated by less than `gap` stored bytes are merged, no range exceeds
    `window` unless a single chunk does."""
    out: list[tuple[int, int]] = []
    start = end = -1
    for c in chunks:
        if c.blob_offset not in missing:
            continue
        c_end = c.blob_offset + c.blob_size
        if start >= 0 and c.blob_offset - end < gap and c_end - start <= window:
            end = c_end
            continue
        if start >= 0:
            out.append((start, end - start))
        start, end = c.blob_offset, c_end
    if start >= 0:
        out.append((start, end - start))
    return out


def _safe(dst: Path, path: str) -> Path:
    if path.startswith("/") or ".." in path.split("/"):
        raise FormatError(f"unsafe path {path!r} in a layer TOC")
    return dst / path if path else dst


def _make_entry(dst: Path, e: TocEntry) -> None:
    p = _safe(dst, e.path)
    if e.type is EntryType.DIR:
        if e.path:
            os.mkdir(p, 0o700)
    elif e.type is EntryType.REG:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            if e.size:
                os.ftruncate(fd, e.size)
        finally:
            os.close(fd)
    elif e.type is EntryType.SYMLINK:
        os.symlink(e.link, p)
    elif e.type is EntryType.WHITEOUT:
        os.mknod(p, stat.S_IFCHR, os.makedev(0, 0))  # overlayfs whiteout
    elif e.type in (EntryType.CHAR, EntryType.BLOCK):
        kind = stat.S_IFCHR if e.type is EntryType.CHAR else stat.S_IFBLK
        os.mknod(p, kind | 0o600, os.makedev(e.rdev_major, e.rdev_minor))
    elif e.type is EntryType.FIFO:
        os.mkfifo(p, 0o600)
    elif e.type is EntryType.HARDLINK:
        pass  # linked once every regular file is complete
    else:  # pragma: no cover - the TOC decoder knows no other types
        raise FormatError(f"unknown entry type {e.type!r}")


def _finish_entry(dst: Path, e: TocEntry) -> None:
    """Owner, xattrs, mode, mtime (in this order: chown clears setuid bits)."""
    p = _safe(dst, e.path)
    if e.type is EntryType.HARDLINK:
        return
    os.lchown(p, e.uid, e.gid)
    xattrs = dict(e.xattrs)
    if e.type is EntryType.DIR and e.opaque:
        xattrs[OPAQUE_XATTR] = b"y"
    for name, value in xattrs.items():
        os.setxattr(p, name, value, follow_symlinks=False)
    if e.type is not EntryType.SYMLINK:
        os.chmod(p, 0 if e.type is EntryType.WHITEOUT else e.mode & 0o7777)
    os.utime(p, ns=(e.mtime_ns, e.mtime_ns), follow_symlinks=False)


PACE_EVERY = 64
"""Cached chunks copied between two `pace()` calls."""


def extract_layer(read_range: Callable[[int, int], bytes], blob_size: int, dst: Path, *,
                  chunk_cache: Path | None = None, window: int = WINDOW,
                  pace: Callable[[], float] | None = None) -> ExtractStats:
    """Materialize the layer behind `read_range` into `dst` (which must not exist yet).
    `pace()` is called before every range read and every `PACE_EVERY` cached chunks, and
    returns the seconds it waited (the node's: until enough CPU is idle, `host.cpuidle.idle_pacer`)."""
    t0 = time.perf_counter()
    stats = ExtractStats()

    def paced() -> None:
        if pace is not None:
            stats.paced_seconds += pace()
    src = _RangeSource(read_range, blob_size)
    toc = read_toc(src).toc
    entries = toc.entries
    stats.entries = len(entries)
    dst.mkdir(mode=0o700)
    for e in entries:  # sorted by path: a directory comes before its subtree
        _make_entry(dst, e)
    # every stored chunk -> the (file, offset) places it goes; a chunk shared by files is read once
    places: dict[int, list[tuple[str, int]]] = {}
    by_offset: dict[int, Chunk] = {}
    for e in entries:
        if e.type is EntryType.REG and e.chunks:
            stats.files += 1
            for c in e.chunks:
                places.setdefault(c.blob_offset, []).append((e.path, c.offset))
                by_offset.setdefault(c.blob_offset, c)
        elif e.type is EntryType.REG:
            stats.files += 1
    chunks = [by_offset[o] for o in sorted(by_offset)]
    fds: dict[str, int] = {}

    def put(c: Chunk, data: bytes) -> None:
        for path, off in places[c.blob_offset]:
            fd = fds.get(path)
            if fd is None:
                if len(fds) >= 256:
                    os.close(fds.pop(next(iter(fds))))
                fd = fds[path] = os.open(_safe(dst, path), os.O_WRONLY | os.O_CLOEXEC)
            os.pwrite(fd, data, off)
            stats.bytes_written += len(data)

    try:
        missing: set[int] = set()
        for n, c in enumerate(chunks):
            if n % PACE_EVERY == 0:
                paced()
            data = _cached(chunk_cache, c)
            if data is None:
                missing.add(c.blob_offset)
            else:
                stats.from_cache_bytes += len(data)
                put(c, data)
        ranges = plan_ranges(chunks, missing, window=window)
        i = 0
        for start, length in ranges:
            paced()
            buf = read_range(start, length)
            stats.requests += 1
            stats.fetched_bytes += len(buf)
            if len(buf) != length:
                raise IntegrityError(f"short read of blob range [{start}, {start + length}): {len(buf)} bytes")
            mv = memoryview(buf)
            while i < len(chunks) and chunks[i].blob_offset < start + length:
                c = chunks[i]
                i += 1
                if c.blob_offset not in missing:
                    continue
                lo = c.blob_offset - start
                put(c, decode_chunk(c, mv[lo:lo + c.blob_size]))
    finally:
        for fd in fds.values():
            os.close(fd)
    for e in entries:
        if e.type is EntryType.HARDLINK:
            target = toc.resolve(e)
            os.link(_safe(dst, target.path), _safe(dst, e.path), follow_symlinks=False)
    for e in reversed(entries):  # children before parents: a directory's mtime is set last
        _finish_entry(dst, e)
    stats.seconds = time.perf_counter() - t0
    return stats


# -- the node's process --------------------------------------------------------------------------

def lower_priority() -> None:
    """This process yields to everything else: SCHED_IDLE (or nice 19) and the idle I/O class."""
    try:
        os.nice(19)
    except OSError:
        pass
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError):
        pass
    try:  # ioprio_set(IOPRIO_WHO_PROCESS, 0, IOPRIO_CLASS_IDLE << 13)
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall(251 if os.uname().machine == "x86_64" else 30, 1, 0, 3 << 13)
    except (OSError, AttributeError):
        pass


def spawn_args(store: str, repo: str, digest: str, dst: Path, chunk_cache: Path | None,
               cgroups: "list[Path] | tuple[Path, ...]" = (), min_idle: float = 0.0) -> list[str]:
    """The extraction's command line; `cgroups`: the node's background cgroup dirs
    (host.background), joined before any work; `min_idle`: cores that must be idle before
    each read (`host.cpuidle.idle_pacer`)."""
    argv = [sys.executable, "-m", "rollstack.lowers.extract", "--store", store, "--repo", repo,
            "--digest", digest, "--dst", str(dst), "--min-idle", repr(float(min_idle))]
    if chunk_cache is not None:
        argv += ["--chunk-cache", str(chunk_cache)]
    for cg in cgroups:
        argv += ["--cgroup", str(cg)]
    return argv


def main(argv: list[str] | None = None) -> int:
    import json

    from rollstack.store import open_store

    ap = argparse.ArgumentParser(prog="python -m rollstack.lowers.extract")
    ap.add_argument("--store", required=True)
    ap.add_argument("--repo", required=True)
    ap.add_argument("--digest", required=True)
    ap.add_argument("--dst", required=True, type=Path)
    ap.add_argument("--chunk-cache", type=Path)
    ap.add_argument("--no-lower-priority", action="store_true")
    ap.add_argument("--cgroup", type=Path, action="append", default=[],
                    help="a background cgroup dir to join first (repeatable)")
    ap.add_argument("--min-idle", type=float, default=0.0,
                    help="idle cores to wait for before each read (0: do not wait)")
    args = ap.parse_args(argv)
    die_with_spawner()  # never an orphan, least of all one a fork stopped (host.foreground)
    if args.cgroup:
        from rollstack.host.background import join

        join(args.cgroup)
    if not args.no_lower_priority:
        lower_priority()
    store = open_store(args.store)
    try:
        size = store.blob_size(args.repo, args.digest)
        stats = extract_layer(lambda o, n: store.read_blob(args.repo, args.digest, o, n), size, args.dst,
                              chunk_cache=args.chunk_cache,
                              pace=cpuidle.idle_pacer(args.min_idle) if args.min_idle > 0 else None)
    finally:
        store.close()
    print(json.dumps(stats.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
