"""Writes one layer blob: payload chunks as they stream in, then the TOC, then the footer.

`LayerWriter` knows nothing about tar or directories (see `convert`): it takes entries with
already-normalised paths plus a payload stream for regular files, and enforces the layer's
invariants: safe paths, hardlinks to earlier entries inside the layer, no conflicting
duplicates, every ancestor a directory (missing ones are added, deterministically). Memory is
O(entries + unique chunks), never O(payload).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, replace
from typing import BinaryIO, Callable, Protocol

import zstandard

from rollstack.errors import InvalidRequest, SourceInvalid, UnsafePath
from rollstack.format import paths as layer_paths
from rollstack.format import toc_codec
from rollstack.format.chunk import encode_chunk
from rollstack.format.footer import Footer
from rollstack.format.pipeline import ChunkPipeline
from rollstack.format.toc import TOC_ZSTD_LEVEL, Chunk, Compression, EntryType, Toc, TocEntry

DEFAULT_CHUNK_SIZE = 1 << 20
MIN_CHUNK_SIZE = 4 << 10
MAX_CHUNK_SIZE = 64 << 20
DEFAULT_LEVEL = 3
IMPLICIT_DIR_MODE = 0o755
from rollstack.format import LAYER_MEDIA_TYPE  # noqa: E402  (one definition)


class Readable(Protocol):
    """What a payload needs to be: bytes read front to back (a file, a tar member, a pipe)."""

    def read(self, n: int = -1, /) -> bytes: ...


@dataclass(frozen=True, slots=True)
class LayerInfo:
    """What a conversion produced (the blob's OCI descriptor plus statistics)."""

    digest: str  # sha256 of the whole blob: its OCI descriptor digest
    size: int  # blob bytes
    toc_size: int  # compressed TOC bytes (as stored)
    toc_raw_size: int  # TOC bytes before zstd
    entries: int
    files: int  # regular files
    chunks: int  # stored (unique) chunks
    chunk_refs: int  # chunk references from files (>= chunks when chunks dedupe)
    payload_size: int  # sum of regular file sizes, uncompressed
    stored_payload_size: int  # payload bytes in the blob
    chunk_size: int
    media_type: str = LAYER_MEDIA_TYPE

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def descriptor(self) -> dict[str, object]:
        """The OCI descriptor of the blob (for a manifest's `layers`)."""
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


class _HashingSink:
    """Counts and hashes every byte written, so the blob digest costs no second pass."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.offset = 0
        self.sha = hashlib.sha256()

    def write(self, data: bytes) -> None:
        self.out.write(data)
        self.sha.update(data)
        self.offset += len(data)


class LayerWriter:
    def __init__(self, out: BinaryIO, *, chunk_size: int = DEFAULT_CHUNK_SIZE,
                 level: int = DEFAULT_LEVEL, threads: int = 1) -> None:
        if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
            raise InvalidRequest(f"chunk size {chunk_size} outside [{MIN_CHUNK_SIZE}, {MAX_CHUNK_SIZE}]")
        self._sink = _HashingSink(out)
        self.chunk_size = chunk_size
        self._cctx = zstandard.ZstdCompressor(level=level)  # single-threaded: deterministic frames
        self._entries: dict[str, TocEntry] = {}
        self._stored: dict[str, tuple[int, int, Compression]] = {}  # digest -> where it lives
        self._opaque: set[str] = set()
        self._chunk_refs = 0
        self._payload = 0
        self._finished = False
        # threads > 1: digests + zstd frames on a pool, committed in input order (same bytes)
        self._pipe = ChunkPipeline(level, threads, self._commit) if threads > 1 else None

    def close(self) -> None:
        """Stop the chunk workers (after `finish`, or to abandon a failed conversion)."""
        if self._pipe is not None:
            self._pipe.close()

    # -- adding entries -----------------------------------------------------------------
    def add(self, entry: TocEntry, payload: Readable | None = None) -> TocEntry:
        """Add one entry. Regular files need `payload` (read to EOF; `entry.size` is set from
        what was read). Returns the entry as recorded."""
        if entry.path != layer_paths.normalize(entry.path):
            raise UnsafePath(f"entry {entry.path!r} is not a normalised layer path")
        _check_fields(entry)
        if entry.type is EntryType.REG:
            entry = replace(entry, chunks=[], size=0)
            if payload is not None:
                self._write_payload(entry, payload)
        elif entry.type is EntryType.HARDLINK:
            entry = self._check_hardlink(entry)
        else:
            entry = replace(entry, chunks=[], size=0 if entry.type is not EntryType.SYMLINK else len(entry.link.encode("utf-8", "surrogateescape")))
        if entry.type is EntryType.DIR and entry.path in self._opaque:
            entry.opaque = True
        self._put(entry)
        return entry

    def has(self, path: str) -> bool:
        """Whether this layer already has an entry (of any type) at `path`."""
        return path in self._entries

    def mark_opaque(self, directory: str) -> None:
        """OCI `.wh..wh..opq`: `directory` hides everything below it in lower layers."""
        self._opaque.add(directory)
        cur = self._entries.get(directory)
        if cur is not None and cur.type is EntryType.DIR:
            cur.opaque = True

    def _put(self, entry: TocEntry) -> None:
        cur = self._entries.get(entry.path)
        if cur is not None and self._pipe is not None and EntryType.REG in (cur.type, entry.type):
            self._pipe.drain()  # comparing duplicates needs their chunk digests
        if cur is None:
            self._entries[entry.path] = entry
        elif EntryType.WHITEOUT in (cur.type, entry.type) and cur.type is not entry.type:
            # OCI: a whiteout only hides lower layers, so a same-layer entry with the same path
            # survives; for a directory that means nothing from below shows through: opaque.
            keep = entry if cur.type is EntryType.WHITEOUT else cur
            if keep.type is EntryType.DIR:
                keep.opaque = True
            self._entries[entry.path] = keep
        elif cur.type is EntryType.DIR and entry.type is EntryType.DIR:
            entry.opaque = entry.opaque or cur.opaque  # a repeated directory: the last header wins
            self._entries[entry.path] = entry
        elif not _same(cur, entry):
            raise SourceInvalid(f"duplicate conflicting entries for {entry.path!r} ({cur.type.value} vs {entry.type.value})")

    def _check_hardlink(self, entry: TocEntry) -> TocEntry:
        target_path = layer_paths.normalize(entry.link, what=f"hardlink target of {entry.path!r}")
        target = self._entries.get(target_path)
        if target is None:
            raise UnsafePath(f"hardlink {entry.path!r} points to {entry.link!r}, which is not an earlier entry of the layer")
        if target.type is EntryType.HARDLINK:  # chains collapse onto the first name
            target_path, target = target.link, self._entries[target.link]
        if target.type in (EntryType.DIR, EntryType.WHITEOUT):
            raise SourceInvalid(f"hardlink {entry.path!r} points to {target.type.value} {target_path!r}")
        if target_path == entry.path:
            raise SourceInvalid(f"hardlink {entry.path!r} points to itself")
        return replace(entry, link=target_path, size=target.size, chunks=[])

    # -- payload ------------------------------------------------------------------------
    def _write_payload(self, entry: TocEntry, payload: Readable) -> None:
        size = 0
        while True:
            data = _read_full(payload, self.chunk_size)
            if not data:
                break
            if self._pipe is not None:
                self._pipe.submit(entry, size, data)
            else:
                self._store_chunk(entry, size, data)
            size += len(data)
            if len(data) < self.chunk_size:
                break
        entry.size = size
        self._payload += size

    def _store_chunk(self, entry: TocEntry, file_offset: int, data: bytes) -> None:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self._commit(entry, file_offset, len(data), digest, lambda: encode_chunk(data, self._cctx))

    def _commit(self, entry: TocEntry, file_offset: int, size: int, digest: str,
                stored: Callable[[], tuple[bytes, Compression]]) -> None:
        """Chunk `digest` of `entry` at `file_offset`, in input order: write it unless stored."""
        self._chunk_refs += 1
        where = self._stored.get(digest)
        if where is None:  # identical chunks are stored once per layer
            data, comp = stored()
            where = (self._sink.offset, len(data), comp)
            self._sink.write(data)
            self._stored[digest] = where
        entry.chunks.append(Chunk(file_offset, size, where[0], where[1], digest, where[2]))

    # -- finishing ----------------------------------------------------------------------
    def finish(self, existing_dir: Callable[[str], TocEntry | None] | None = None) -> LayerInfo:
        """Complete the entry set, write TOC + footer, return the blob's descriptor + stats.

        `existing_dir(path)`: the directory lower layers already have at `path`, if any; a
        directory this layer only implies (a parent of its entries, an opaque marker without
        its directory's header) then keeps that one's metadata, as unpacking onto the lower
        tree would, instead of becoming 0755 root:root over it."""
        if self._finished:
            raise RuntimeError("LayerWriter.finish() called twice")
        self._finished = True
        if self._pipe is not None:
            try:
                self._pipe.drain()
            finally:
                self._pipe.close()
        payload_end = self._sink.offset
        for d in sorted(self._opaque):
            if d not in self._entries:
                self._entries[d] = _implicit_dir(d, existing_dir, opaque=True)
        self._add_implicit_dirs(existing_dir)
        toc = Toc(self._entries.values())
        raw = toc_codec.encode_raw(toc.entries)
        raw_len = len(raw)
        toc_bytes = toc_codec.compress(raw, TOC_ZSTD_LEVEL)
        toc_digest = "sha256:" + hashlib.sha256(toc_bytes).hexdigest()
        toc_offset = self._sink.offset
        self._sink.write(toc_bytes)
        self._sink.write(Footer(toc_offset, len(toc_bytes), raw_len, toc_digest).encode())
        return LayerInfo(
            digest="sha256:" + self._sink.sha.hexdigest(), size=self._sink.offset,
            toc_size=len(toc_bytes), toc_raw_size=raw_len, entries=len(toc),
            files=sum(1 for e in self._entries.values() if e.type is EntryType.REG),
            chunks=len(self._stored), chunk_refs=self._chunk_refs, payload_size=self._payload,
            stored_payload_size=payload_end, chunk_size=self.chunk_size,
        )

    def _add_implicit_dirs(self, existing_dir: Callable[[str], TocEntry | None] | None) -> None:
        if "" not in self._entries:
            self._entries[""] = _implicit_dir("", existing_dir)
        elif self._entries[""].type is not EntryType.DIR:
            raise SourceInvalid("the layer root is not a directory")
        for path in list(self._entries):
            # walk up to the nearest directory this layer names: that one checks its own
            # ancestors when its turn comes (O(entries), not O(entries x depth))
            anc = layer_paths.parent(path) if path else None
            while anc:
                cur = self._entries.get(anc)
                if cur is None:
                    self._entries[anc] = _implicit_dir(anc, existing_dir)
                elif cur.type is EntryType.WHITEOUT:  # deleted then recreated in this layer
                    self._entries[anc] = TocEntry(anc, EntryType.DIR, IMPLICIT_DIR_MODE, opaque=True)
                elif cur.type is EntryType.DIR:
                    break
                else:
                    raise SourceInvalid(f"entry {path!r} lies below {anc!r}, which is a {cur.type.value}, not a directory")
                anc = layer_paths.parent(anc)


def _implicit_dir(path: str, existing_dir: Callable[[str], TocEntry | None] | None, opaque: bool = False) -> TocEntry:
    below = existing_dir(path) if existing_dir is not None else None
    if below is None or below.type is not EntryType.DIR:
        return TocEntry(path, EntryType.DIR, IMPLICIT_DIR_MODE, opaque=opaque)
    return TocEntry(path, EntryType.DIR, below.mode, below.uid, below.gid, below.mtime_ns,
                    xattrs=dict(below.xattrs), opaque=opaque)


def _check_fields(e: TocEntry) -> None:
    """Everything must fit its TOC field (docs/format.md, "Limits"); say which entry does not."""
    for name in ("uid", "gid", "rdev_major", "rdev_minor"):
        if not 0 <= getattr(e, name) <= _U32:
            raise SourceInvalid(f"entry {e.path!r}: {name} {getattr(e, name)} does not fit in 32 bits")
    if not -(1 << 63) <= e.mtime_ns < (1 << 63):
        raise SourceInvalid(f"entry {e.path!r}: mtime out of range")
    if len(e.xattrs) > 0xFFFF:
        raise SourceInvalid(f"entry {e.path!r}: more than 65535 xattrs")
    for k, v in e.xattrs.items():
        if len(k.encode("utf-8", "surrogateescape")) > 0xFFFF or len(v) > _U32:
            raise SourceInvalid(f"entry {e.path!r}: xattr {k[:64]!r} is too large")
    if "\0" in e.link:
        raise SourceInvalid(f"entry {e.path!r}: link target contains a NUL byte")


_U32 = (1 << 32) - 1


def _same(a: TocEntry, b: TocEntry) -> bool:
    """Duplicates are tolerated only when they describe exactly the same entry."""
    def key(e: TocEntry) -> tuple[object, ...]:
        return (e.type, e.mode, e.uid, e.gid, e.mtime_ns, e.size, e.link, e.rdev_major, e.rdev_minor, e.xattrs,
                [c.digest for c in e.chunks])
    return key(a) == key(b)


def _read_full(stream: Readable, n: int) -> bytes:
    """Read exactly n bytes unless EOF comes first (streams may return short reads)."""
    data = stream.read(n)
    if not data or len(data) == n:
        return data or b""
    parts = [data]
    got = len(data)
    while got < n:
        more = stream.read(n - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)
