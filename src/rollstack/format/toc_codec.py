"""The byte encoding of a TOC (docs/format.md, "TOC encoding"). Pure: bytes in, bytes out.

Columnar on purpose: all paths are one NUL-joined UTF-8 string (decoded with one `split`), the
fixed-size fields are one array of 48-byte records, chunks one array of 57-byte records. A reader
decodes only the path column up front; `TocEntry`/`Chunk` objects are built on first access.
The whole raw TOC is then one zstd frame.
"""

from __future__ import annotations

import gc
import operator
import struct

import numpy as np
import zstandard

from rollstack.errors import FormatError
from rollstack.format.toc import TOC_ZSTD_LEVEL, Chunk, Compression, EntryType, Toc, TocEntry

RAW_MAGIC = b"RSTOC\x00\x00\x01"
RAW_VERSION = 1
MAX_RAW_TOC = 1 << 31  # 2 GiB decompressed: far beyond any real layer, bounds a hostile frame

# magic, version, reserved, n_entries, n_chunks, paths_len, links_len, xattrs_len
HEADER = struct.Struct("<8sHHIIQQQ")
# type, flags, mode, uid, gid, mtime_ns, size, rdev_major, rdev_minor, first_chunk, n_chunks, xattr_off
RECORD = struct.Struct("<BBHIIqQIIIII")
# offset (in file), size, blob_offset, blob_size, compression, sha256
CHUNK = struct.Struct("<QIQIB32s")

# the two RECORD fields `Toc.xattr_indices` needs, at their offsets in the 48-byte record
_RECORD_COLUMNS = np.dtype({"names": ["flags", "xoff"], "formats": ["u1", "<u4"], "offsets": [1, 44],
                            "itemsize": RECORD.size})
# the RECORD fields `Toc.data_files` needs: type and size
_FILE_COLUMNS = np.dtype({"names": ["type", "size"], "formats": ["u1", "<u8"], "offsets": [0, 20],
                          "itemsize": RECORD.size})
NO_XATTRS = 0xFFFFFFFF
FLAG_OPAQUE = 1

TYPE_CODES: dict[EntryType, int] = {
    EntryType.REG: 0,
    EntryType.DIR: 1,
    EntryType.SYMLINK: 2,
    EntryType.HARDLINK: 3,
    EntryType.CHAR: 4,
    EntryType.BLOCK: 5,
    EntryType.FIFO: 6,
    EntryType.WHITEOUT: 7,
}
CODE_TYPES = {v: k for k, v in TYPE_CODES.items()}
COMPRESSION_CODES: dict[Compression, int] = {Compression.NONE: 0, Compression.ZSTD: 1}
CODE_COMPRESSIONS = {v: k for k, v in COMPRESSION_CODES.items()}


def encode(toc: Toc, level: int = TOC_ZSTD_LEVEL) -> bytes:
    """The TOC as stored in a blob: zstd-compressed binary (docs/format.md)."""
    return compress(encode_raw(toc.entries), level)


def decode(data: bytes) -> Toc:
    """Inverse of `encode` (raises FormatError on anything malformed)."""
    return decode_raw(decompress(data))


def _b(s: str) -> bytes:
    return s.encode("utf-8", "surrogateescape")


def encode_raw(entries: list[TocEntry]) -> bytes:
    """Entries (already in TOC order) -> raw TOC bytes."""
    records = bytearray()
    chunks = bytearray()
    xattrs = bytearray()
    n_chunks = 0
    for e in entries:
        if e.xattrs:
            xoff = len(xattrs)
            if xoff >= NO_XATTRS:
                raise FormatError("xattr section exceeds 4 GiB")
            xattrs += struct.pack("<H", len(e.xattrs))
            for k in sorted(e.xattrs):
                kb, v = _b(k), bytes(e.xattrs[k])
                xattrs += struct.pack("<H", len(kb)) + kb + struct.pack("<I", len(v)) + v
        else:
            xoff = NO_XATTRS
        records += RECORD.pack(
            TYPE_CODES[e.type], FLAG_OPAQUE if e.opaque else 0, e.mode & 0o7777, e.uid, e.gid,
            e.mtime_ns, e.size, e.rdev_major, e.rdev_minor, n_chunks, len(e.chunks), xoff,
        )
        for c in e.chunks:
            digest = c.digest
            if not digest.startswith("sha256:") or len(digest) != 71:
                raise FormatError(f"chunk digest {digest!r} of {e.path!r} is not sha256")
            chunks += CHUNK.pack(c.offset, c.size, c.blob_offset, c.blob_size,
                                 COMPRESSION_CODES[c.compression], bytes.fromhex(digest[7:]))
        n_chunks += len(e.chunks)
    paths = _b("\0".join(e.path for e in entries))
    links = _b("\0".join(e.link for e in entries))
    header = HEADER.pack(RAW_MAGIC, RAW_VERSION, 0, len(entries), n_chunks,
                         len(paths), len(links), len(xattrs))
    return b"".join((header, paths, links, bytes(records), bytes(chunks), bytes(xattrs)))


def compress(raw: bytes, level: int) -> bytes:
    return zstandard.ZstdCompressor(level=level, write_content_size=True).compress(raw)


def decompress(data: bytes) -> bytes:
    try:
        params = zstandard.get_frame_parameters(data)
        if params.content_size > MAX_RAW_TOC:
            raise FormatError(f"TOC claims {params.content_size} bytes decompressed (limit {MAX_RAW_TOC})")
        return zstandard.ZstdDecompressor().decompress(data, max_output_size=MAX_RAW_TOC)
    except zstandard.ZstdError as exc:
        raise FormatError(f"TOC is not a valid zstd frame: {exc}") from None


def decode_raw(raw: bytes) -> Toc:
    """Raw TOC bytes -> a lazily materialised `Toc`. Structure is checked up front; per-entry
    fields are checked when the entry is built."""
    if len(raw) < HEADER.size:
        raise FormatError("TOC too short")
    magic, version, _, n, n_chunks, plen, llen, xlen = HEADER.unpack_from(raw, 0)
    if magic != RAW_MAGIC:
        raise FormatError("TOC has a bad magic number")
    if version != RAW_VERSION:
        raise FormatError(f"unsupported TOC version {version}")
    pos = HEADER.size
    rec_off = pos + plen + llen
    chk_off = rec_off + n * RECORD.size
    x_off = chk_off + n_chunks * CHUNK.size
    if x_off + xlen != len(raw):
        raise FormatError("TOC section lengths do not add up")
    try:
        paths = _split(raw[pos:pos + plen], n)
        links = _split(raw[pos + plen:rec_off], n)
    except UnicodeDecodeError:  # pragma: no cover - surrogateescape accepts any bytes
        raise FormatError("TOC path column is not decodable") from None
    if len(paths) != n or len(links) != n:
        raise FormatError("TOC path/link columns do not match the entry count")
    if not all(map(operator.lt, paths, paths[1:])):  # C-speed strict-order check
        raise FormatError("TOC paths are not strictly sorted")
    view = memoryview(raw)
    xattr_view = view[x_off:]

    def load(i: int) -> TocEntry:
        try:
            (tcode, flags, mode, uid, gid, mtime, size, rmaj, rmin, first, count,
             xoff) = RECORD.unpack_from(raw, rec_off + i * RECORD.size)
            etype = CODE_TYPES[tcode]
            if mode > 0o7777 or flags & ~FLAG_OPAQUE:
                raise FormatError(f"TOC entry {paths[i]!r} has invalid mode/flags")
            if first + count > n_chunks:
                raise FormatError(f"TOC entry {paths[i]!r} references chunks out of range")
            if count == 0:
                chunks = []
            elif count == 1:  # the common case; a comprehension costs a frame per entry
                chunks = [_chunk(raw, chk_off + first * CHUNK.size)]
            else:
                chunks = [_chunk(raw, chk_off + j * CHUNK.size) for j in range(first, first + count)]
            xattrs = _xattrs(xattr_view, xoff) if xoff != NO_XATTRS else {}
        except (KeyError, struct.error, IndexError) as exc:
            raise FormatError(f"TOC entry {i} is malformed: {exc}") from None
        return TocEntry(paths[i], etype, mode, uid, gid, mtime, size, links[i], rmaj, rmin,
                        xattrs, bool(flags & FLAG_OPAQUE), chunks)

    def load_all() -> list[TocEntry]:
        # Bulk path for `Toc.entries`: one iter_unpack per column instead of a call per entry.
        # The cyclic GC is paused meanwhile: these ~4 objects per entry hold no cycles, and
        # repeated collections over a big heap doubled the cost of building them.
        paused = gc.isenabled()
        gc.disable()
        try:
            return _build_all()
        finally:
            if paused:
                gc.enable()

    def _build_all() -> list[TocEntry]:
        try:
            chunks = [Chunk(o, sz, bo, bs, "sha256:" + d.hex(), CODE_COMPRESSIONS[c])
                      for o, sz, bo, bs, c, d in CHUNK.iter_unpack(view[chk_off:x_off])]
            out: list[TocEntry] = []
            append = out.append
            for i, (tcode, flags, mode, uid, gid, mtime, size, rmaj, rmin, first, count, xoff) in enumerate(
                    RECORD.iter_unpack(view[rec_off:chk_off])):
                if first + count > n_chunks or mode > 0o7777 or flags & ~FLAG_OPAQUE:
                    raise FormatError(f"TOC entry {paths[i]!r} has invalid chunk range, mode or flags")
                append(TocEntry(paths[i], CODE_TYPES[tcode], mode, uid, gid, mtime, size, links[i], rmaj, rmin,
                                _xattrs(xattr_view, xoff) if xoff != NO_XATTRS else {},
                                bool(flags & FLAG_OPAQUE), chunks[first:first + count]))
            return out
        except (KeyError, struct.error, IndexError) as exc:
            raise FormatError(f"TOC is malformed: {exc}") from None

    def scan_xattrs() -> list[int]:
        # the flags byte and the xattr offset of every record, read as numpy columns
        records = np.frombuffer(raw, dtype=_RECORD_COLUMNS, count=n, offset=rec_off)
        marked = (records["xoff"] != NO_XATTRS) | ((records["flags"] & FLAG_OPAQUE) != 0)
        return np.flatnonzero(marked).tolist()

    def scan_files() -> tuple[list[int], list[int]]:
        records = np.frombuffer(raw, dtype=_FILE_COLUMNS, count=n, offset=rec_off)
        pos = np.flatnonzero((records["type"] == TYPE_CODES[EntryType.REG]) & (records["size"] > 0))
        return pos.tolist(), records["size"][pos].tolist()

    return Toc._lazy(paths, load, load_all, scan_xattrs, scan_files)


def _split(b: bytes, n: int) -> list[str]:
    if n == 0:
        return [] if not b else [""] * 2  # non-empty column with no entries -> count mismatch
    return b.decode("utf-8", "surrogateescape").split("\0")


def _chunk(raw: bytes, off: int) -> Chunk:
    offset, size, boff, bsize, comp, digest = _unpack_chunk(raw, off)
    return Chunk(offset, size, boff, bsize, "sha256:" + digest.hex(), CODE_COMPRESSIONS[comp])


_unpack_chunk = CHUNK.unpack_from


def _xattrs(view: memoryview, off: int) -> dict[str, bytes]:
    (count,) = struct.unpack_from("<H", view, off)
    off += 2
    out: dict[str, bytes] = {}
    for _ in range(count):
        (klen,) = struct.unpack_from("<H", view, off)
        off += 2
        key = bytes(view[off:off + klen]).decode("utf-8", "surrogateescape")
        off += klen
        (vlen,) = struct.unpack_from("<I", view, off)
        off += 4
        if off + vlen > len(view):
            raise IndexError("xattr value past end of section")
        out[key] = bytes(view[off:off + vlen])
        off += vlen
    return out
