"""Layer format basics: TOC codec round trip, convert -> read back, dedupe, determinism."""

from __future__ import annotations

from rollstack.format import toc_codec

import hashlib
import io
import os
import tarfile

import pytest

from format_tar_helpers import tar_bytes, ti
from rollstack.format import (BytesBlobSource, Chunk, EntryType, LayerReader, Toc, TocEntry,
                              convert_tar, open_toc)
from rollstack.format.footer import FOOTER_SIZE, Footer


def _layer(members: list[tuple[tarfile.TarInfo, bytes | None]], **kw: int) -> bytes:
    out = io.BytesIO()
    convert_tar(io.BytesIO(tar_bytes(members)), out, **kw)
    return out.getvalue()


def test_toc_codec_round_trip_all_fields() -> None:
    entries = [
        TocEntry("", EntryType.DIR, 0o755),
        TocEntry("a", EntryType.DIR, 0o1777, 1, 2, -5, opaque=True, xattrs={"user.x": b"\0\xff"}),
        TocEntry("a/f", EntryType.REG, 0o4755, 1000, 1000, 123456789123456789, 10,
                 chunks=[Chunk(0, 10, 0, 7, "sha256:" + "ab" * 32)]),
        TocEntry("a/l", EntryType.SYMLINK, 0o777, link="../f\udcff"),
        TocEntry("a/h", EntryType.HARDLINK, link="a/f", size=10),
        TocEntry("dev", EntryType.BLOCK, rdev_major=8, rdev_minor=1),
        TocEntry("gone", EntryType.WHITEOUT, 0),
    ]
    toc = Toc(entries)
    back = toc_codec.decode(toc_codec.encode(toc))
    assert back.paths == sorted(e.path for e in entries)
    assert back.entries == toc.entries
    assert back.lookup("a/f") == entries[2]
    assert back.lookup("nope") is None
    assert [e.path for e in back.children("a")] == ["a/f", "a/h", "a/l"]
    assert back.resolve(back.lookup("a/h")).path == "a/f"


def test_convert_and_read_back() -> None:
    big = os.urandom(300_000)
    blob = _layer([
        (ti("./etc", tarfile.DIRTYPE, mode=0o755), None),
        (ti("./etc/passwd", mode=0o644, uid=0, mtime=1700000000), b"root:x:0:0\n"),
        (ti("./big", mode=0o600), big),
        (ti("./big2", mode=0o600), big),  # same content: chunks stored once
        (ti("./hl", tarfile.LNKTYPE, linkname="./big"), None),
        (ti("./etc/.wh.shadow"), b""),
        (ti("./var/.wh..wh..opq"), b""),
        (ti("./empty"), b""),
    ], chunk_size=64 << 10)
    src = BytesBlobSource(blob)
    r = LayerReader(src)
    assert r.open_requests == 1 and src.requests == 1
    assert r.read("etc/passwd") == b"root:x:0:0\n"
    assert r.read("big") == big and r.read("big2") == big and r.read("hl") == big
    assert r.read("big", 70_000, 100_000) == big[70_000:170_000]
    assert len(r.chunks_for(r.toc.lookup("big"), 65535, 2)) == 2
    assert r.read("empty") == b""
    assert r.toc.lookup("etc/shadow").type is EntryType.WHITEOUT
    assert r.toc.lookup("var").opaque is True
    e1, e2 = r.toc.lookup("big"), r.toc.lookup("big2")
    assert [c.blob_offset for c in e1.chunks] == [c.blob_offset for c in e2.chunks]
    assert r.toc.lookup("etc/passwd").mtime_ns == 1700000000 * 10**9


def test_deterministic() -> None:
    members = [(ti(f"d{i}/f{i}", mode=0o644), os.urandom(1000) * 5) for i in range(5)]
    assert _layer(members) == _layer(members)


def test_footer_round_trip_and_open_toc() -> None:
    blob = _layer([(ti("x"), b"x")])
    f = Footer.decode(blob[-FOOTER_SIZE:], blob_size=len(blob))
    assert f.toc_offset + f.toc_length == len(blob) - FOOTER_SIZE
    assert open_toc(BytesBlobSource(blob)).lookup("x").size == 1
    info = convert_tar(io.BytesIO(tar_bytes([(ti("x"), b"x")])), io.BytesIO())
    assert info.descriptor() == {"mediaType": "application/vnd.rollstack.layer.v1", "digest": "sha256:" + hashlib.sha256(blob).hexdigest(), "size": len(blob)}


def test_every_compression_gives_the_same_layer(make_ti, make_tar) -> None:
    import bz2
    import gzip
    import lzma

    import zstandard

    tar = make_tar([(make_ti("d/f", mode=0o640), os.urandom(5000) * 3), (make_ti("g"), b"g")])
    plain = _convert(tar)
    for packed in (gzip.compress(tar), bz2.compress(tar), lzma.compress(tar), zstandard.compress(tar),
                   zstandard.compress(tar[:4000]) + zstandard.compress(tar[4000:])):  # multi-frame zstd
        assert _convert(packed) == plain


def test_pax_nanosecond_mtime_and_binary_xattr(make_ti, make_tar) -> None:
    info = make_ti("f")
    info.pax_headers = {"mtime": "1700000000.123456789", "SCHILY.xattr.user.bin": "\udcff\x00ab",
                        "LIBARCHIVE.xattr.user.lib%20x": "AAEC"}
    e = open_toc(BytesBlobSource(_convert(make_tar([(info, b"x")])))).lookup("f")
    assert e.mtime_ns == 1_700_000_000_123_456_789
    assert e.xattrs == {"user.bin": b"\xff\x00ab", "user.lib x": b"\x00\x01\x02"}


def _convert(tar: bytes) -> bytes:
    out = io.BytesIO()
    convert_tar(io.BytesIO(tar), out)
    return out.getvalue()


def test_read_files_coalesces_small_files_and_verifies_them() -> None:
    from rollstack.errors import IntegrityError
    from rollstack.format.reader import read_files, read_toc

    files = {f"d/f{i:02d}": f"content {i}\n".encode() * (i + 1) for i in range(30)}
    blob = _layer([(ti(p), data) for p, data in files.items()])
    src = BytesBlobSource(blob)
    toc = read_toc(src).toc
    positions = [toc.index(p) for p in files]
    before = src.requests
    got = read_files(src, toc, positions)
    assert {toc.at(p).path: data for p, data in got.items()} == files
    assert src.requests - before == 1  # one range covers them all
    assert len(read_files(src, toc, positions, max_gap=0, max_request=1)) == 30  # one read each still works
    chunk = toc.at(positions[5]).chunks[0]
    bad = bytearray(blob)
    bad[chunk.blob_offset] ^= 0xFF
    with pytest.raises(IntegrityError):
        read_files(BytesBlobSource(bytes(bad)), toc, positions)
