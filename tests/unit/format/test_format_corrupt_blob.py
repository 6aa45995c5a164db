"""Damaged blobs: truncation, bad footer, TOC digest mismatch, flipped chunk bits.

Each must raise FormatError/IntegrityError (typed), never return wrong bytes or crash.
"""

from __future__ import annotations

import hashlib
import os
import struct

import pytest

from rollstack.errors import FormatError, IntegrityError
from rollstack.format import BytesBlobSource, LayerReader, open_toc
from rollstack.format.footer import FOOTER_SIZE, Footer
from rollstack.format.verify import verify_layer

PAYLOAD = os.urandom(200_000) + b"compressible " * 20_000


@pytest.fixture
def blob(make_ti, make_layer) -> bytes:
    return make_layer([(make_ti("f"), PAYLOAD), (make_ti("g"), b"small file\n")], chunk_size=64 << 10)


def _with_footer(blob: bytes, **changes: object) -> bytes:
    f = Footer.decode(blob[-FOOTER_SIZE:])
    fields = {"toc_offset": f.toc_offset, "toc_length": f.toc_length,
              "toc_raw_length": f.toc_raw_length, "toc_digest": f.toc_digest, **changes}
    return blob[:-FOOTER_SIZE] + Footer(**fields).encode()  # type: ignore[arg-type]


def test_intact_blob_verifies(blob: bytes) -> None:
    report = verify_layer(BytesBlobSource(blob))
    assert report.ok, report.problems
    assert report.chunks_checked >= 5


@pytest.mark.parametrize("cut", [1, FOOTER_SIZE, 1000, None])
def test_truncated_blob(blob: bytes, cut: int | None) -> None:
    data = blob[:10] if cut is None else blob[:-cut]
    with pytest.raises(FormatError):
        open_toc(BytesBlobSource(data))
    assert not verify_layer(BytesBlobSource(data)).ok


@pytest.mark.parametrize("pos", [0, 8, 12, FOOTER_SIZE - 1])  # magic, version, flags, end magic
def test_corrupt_footer(blob: bytes, pos: int) -> None:
    data = bytearray(blob)
    data[len(blob) - FOOTER_SIZE + pos] ^= 0x40
    with pytest.raises(FormatError):
        LayerReader(BytesBlobSource(bytes(data)))


def test_footer_offsets_must_be_consistent(blob: bytes) -> None:
    f = Footer.decode(blob[-FOOTER_SIZE:])
    with pytest.raises(FormatError, match="TOC spans"):
        open_toc(BytesBlobSource(_with_footer(blob, toc_offset=f.toc_offset - 1)))
    with pytest.raises(FormatError):
        open_toc(BytesBlobSource(_with_footer(blob, toc_offset=2**63, toc_length=5)))


def test_toc_digest_mismatch(blob: bytes) -> None:
    f = Footer.decode(blob[-FOOTER_SIZE:])
    data = bytearray(blob)
    data[f.toc_offset + f.toc_length // 2] ^= 0x01
    with pytest.raises(IntegrityError, match="TOC does not match"):
        open_toc(BytesBlobSource(bytes(data)))


def test_garbage_toc_with_matching_digest(blob: bytes) -> None:
    """A TOC that passes its digest but is not a valid TOC is a FormatError, not a crash."""
    import zstandard

    f = Footer.decode(blob[-FOOTER_SIZE:])
    head = blob[:f.toc_offset]
    for toc in (b"not zstd at all", zstandard.compress(b"RSTOC\0\0\1" + b"\xff" * 60),
                zstandard.compress(os.urandom(500))):
        digest = "sha256:" + hashlib.sha256(toc).hexdigest()
        raw_len = len(toc)
        data = head + toc + Footer(f.toc_offset, len(toc), raw_len, digest).encode()
        with pytest.raises(FormatError):
            open_toc(BytesBlobSource(data))


def test_flipped_bit_in_chunk(blob: bytes) -> None:
    r = LayerReader(BytesBlobSource(blob))
    entry = r.toc.lookup("f")
    victim = entry.chunks[1]
    data = bytearray(blob)
    data[victim.blob_offset + victim.blob_size // 2] ^= 0x10
    bad = LayerReader(BytesBlobSource(bytes(data)))
    assert bad.read("f", 0, victim.offset) == PAYLOAD[:victim.offset]  # other chunks still fine
    with pytest.raises(IntegrityError):
        bad.read("f")
    with pytest.raises(IntegrityError):
        bad.read("f", victim.offset + 5, 1)
    report = verify_layer(BytesBlobSource(bytes(data)))
    assert not report.ok and len(report.problems) == 1 and "'f'" in report.problems[0]


def test_chunk_table_pointing_outside_the_blob(make_ti, make_layer) -> None:
    """A TOC (digest-valid, since the writer built it) whose chunk lies past the payload."""
    from rollstack.format.toc import Chunk, EntryType, Toc, TocEntry
    from rollstack.format import toc_codec

    chunk = Chunk(0, 10, 5_000, 10, "sha256:" + "00" * 32)
    toc = Toc([TocEntry("", EntryType.DIR), TocEntry("f", EntryType.REG, size=10, chunks=[chunk])])
    raw = toc_codec.encode_raw(toc.entries)
    toc_bytes = toc_codec.compress(raw, 3)
    blob = toc_bytes + Footer(0, len(toc_bytes), len(raw), "sha256:" + hashlib.sha256(toc_bytes).hexdigest()).encode()
    r = LayerReader(BytesBlobSource(blob))
    with pytest.raises(FormatError):
        r.read("f")
    report = verify_layer(BytesBlobSource(blob))
    assert not report.ok and "outside the payload" in report.problems[0]


def test_record_struct_sizes_are_stable() -> None:
    """The on-disk layout (docs/format.md) must not change by accident."""
    from rollstack.format import toc_codec

    assert (toc_codec.HEADER.size, toc_codec.RECORD.size, toc_codec.CHUNK.size, FOOTER_SIZE) == (44, 48, 57, 96)
    assert struct.calcsize("<8sIIQQQ32s16s8s") == FOOTER_SIZE


def test_overlapping_chunk_table_never_returns_bytes() -> None:
    """Chunks that verify individually but overlap in the file must not be stitched together."""
    from rollstack.format import toc_codec
    from rollstack.format.chunk import sha256_digest
    from rollstack.format.toc import Chunk, Compression, EntryType, Toc, TocEntry

    payload = b"A" * 10
    c1 = Chunk(0, 10, 0, 10, sha256_digest(payload), Compression.NONE)
    c2 = Chunk(5, 10, 0, 10, sha256_digest(payload), Compression.NONE)
    toc = Toc([TocEntry("", EntryType.DIR), TocEntry("f", EntryType.REG, size=15, chunks=[c1, c2])])
    raw = toc_codec.encode_raw(toc.entries)
    toc_bytes = toc_codec.compress(raw, 3)
    blob = payload + toc_bytes + Footer(10, len(toc_bytes), len(raw), "sha256:" + hashlib.sha256(toc_bytes).hexdigest()).encode()
    r = LayerReader(BytesBlobSource(blob))
    with pytest.raises(FormatError, match="contiguously"):
        r.read("f")
    assert not verify_layer(BytesBlobSource(blob)).ok
