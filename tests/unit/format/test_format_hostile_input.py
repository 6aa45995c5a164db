"""Hostile or broken sources: each gives its typed error, never a traceback, and DST stays clean."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest

from rollstack.errors import SourceInvalid, UnsafePath
from rollstack.format import EntryType, LayerReader, BytesBlobSource, convert, convert_tar


def _convert(data: bytes) -> bytes:
    out = io.BytesIO()
    convert_tar(io.BytesIO(data), out)
    return out.getvalue()


@pytest.mark.parametrize("name", ["/etc/passwd", "../x", "a/../../x", "a/b/../../../x", "./.."])
def test_unsafe_member_paths(make_ti, make_tar, name: str) -> None:
    with pytest.raises(UnsafePath) as exc:
        _convert(make_tar([(make_ti(name), b"x")]))
    assert repr(name) in str(exc.value)


@pytest.mark.parametrize("target", ["../outside", "/etc/shadow", "missing", "later"])
def test_hardlink_must_target_an_earlier_entry_inside_the_layer(make_ti, make_tar, target: str) -> None:
    members = [(make_ti("a"), b"a"), (make_ti("h", tarfile.LNKTYPE, linkname=target), None),
               (make_ti("later"), b"l")]
    with pytest.raises(UnsafePath, match="'h'|hardlink target"):
        _convert(make_tar(members))


def test_hardlink_to_directory_rejected(make_ti, make_tar) -> None:
    members = [(make_ti("d", tarfile.DIRTYPE), None), (make_ti("h", tarfile.LNKTYPE, linkname="d"), None)]
    with pytest.raises(SourceInvalid, match="hardlink 'h'"):
        _convert(make_tar(members))


def test_duplicates(make_ti, make_tar) -> None:
    with pytest.raises(SourceInvalid, match="duplicate conflicting entries for 'f'"):
        _convert(make_tar([(make_ti("f"), b"one"), (make_ti("f"), b"two")]))
    with pytest.raises(SourceInvalid, match="duplicate"):
        _convert(make_tar([(make_ti("f"), b"one"), (make_ti("f", tarfile.SYMTYPE, linkname="x"), None)]))
    # exact repeats and repeated directories are harmless
    blob = _convert(make_tar([(make_ti("f"), b"one"), (make_ti("f"), b"one"),
                              (make_ti("d", tarfile.DIRTYPE, mode=0o700), None),
                              (make_ti("d", tarfile.DIRTYPE, mode=0o755), None)]))
    r = LayerReader(BytesBlobSource(blob))
    assert r.read("f") == b"one" and r.toc.lookup("d").mode == 0o755


def test_entry_below_a_non_directory(make_ti, make_tar) -> None:
    with pytest.raises(SourceInvalid, match="'a/b' lies below 'a'"):
        _convert(make_tar([(make_ti("a"), b"file"), (make_ti("a/b"), b"x")]))


@pytest.mark.parametrize("name", ["d/.wh.", "d/.wh..", "d/.wh..."])
def test_bad_whiteouts(make_ti, make_tar, name: str) -> None:
    with pytest.raises(UnsafePath):
        _convert(make_tar([(make_ti(name), b"")]))


def test_truncated_archive(make_ti, make_tar) -> None:
    data = make_tar([(make_ti("big"), os.urandom(100_000)), (make_ti("small"), b"s")])
    for cut in (700, 50_000, 100_500):
        with pytest.raises(SourceInvalid, match="truncated|corrupt"):
            _convert(data[:cut])


def test_corrupt_gzip_and_garbage(make_ti, make_tar) -> None:
    gz = bytearray(gzip.compress(make_tar([(make_ti("f"), os.urandom(50_000))])))
    gz[len(gz) // 2] ^= 0xFF
    for bad in (bytes(gz), gzip.compress(b"x")[:-5], b"this is not a tar archive at all" * 40, b"\x28\xb5\x2f\xfdgarbage"):
        with pytest.raises(SourceInvalid):
            _convert(bad)


def test_empty_archive_is_an_empty_layer() -> None:
    r = LayerReader(BytesBlobSource(_convert(b"\0" * 1024)))
    assert [e.path for e in r.toc] == [""] and r.toc.lookup("").type is EntryType.DIR


def test_failed_convert_writes_nothing(tmp_path: Path, make_ti, make_tar) -> None:
    src = tmp_path / "bad.tar"
    src.write_bytes(make_tar([(make_ti("ok"), b"fine"), (make_ti("../escape"), b"x")]))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(UnsafePath):
        convert(src, out / "layer.blob")
    assert list(out.iterdir()) == []
    assert not (tmp_path / "escape").exists()


def test_missing_source(tmp_path: Path) -> None:
    with pytest.raises(SourceInvalid, match="no such"):
        convert(tmp_path / "nope.tar", tmp_path / "x")


def test_whiteout_and_entry_in_the_same_layer(make_ti, make_tar) -> None:
    """OCI: a whiteout hides only lower layers; the same-layer entry wins (dirs become opaque)."""
    blob = _convert(make_tar([
        (make_ti(".wh.f"), b""), (make_ti("f"), b"new"),
        (make_ti("d", tarfile.DIRTYPE), None), (make_ti(".wh.d"), b""),
        (make_ti(".wh.e"), b""), (make_ti("e/child"), b"c"),
    ]))
    toc = LayerReader(BytesBlobSource(blob)).toc
    assert toc.lookup("f").type is EntryType.REG
    assert toc.lookup("d").type is EntryType.DIR and toc.lookup("d").opaque
    assert toc.lookup("e").type is EntryType.DIR and toc.lookup("e").opaque


def test_directory_source_edge_cases(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (real / "sub" / "f").write_bytes(b"data")
    link = tmp_path / "link-to-real"
    link.symlink_to(real)
    a = convert(real, tmp_path / "a.blob")
    b = convert(link, tmp_path / "b.blob")  # a symlinked root is followed; nothing below is
    assert a.digest == b.digest
    (tmp_path / "dst-is-dir").mkdir()
    (tmp_path / "dst-is-dir" / "x").write_bytes(b"keep")
    from rollstack.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="cannot write"):
        convert(real, tmp_path / "dst-is-dir")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.blob", "b.blob", "dst-is-dir", "link-to-real", "real"]


def test_blob_source_errors(tmp_path: Path) -> None:
    from rollstack.errors import BlobNotFound, FormatError
    from rollstack.format import FileBlobSource

    with pytest.raises(BlobNotFound):
        FileBlobSource(tmp_path / "missing")
    with pytest.raises(FormatError, match="not a regular file"):
        FileBlobSource(tmp_path)
    (tmp_path / "tiny").write_bytes(b"abc")
    with pytest.raises(FormatError, match="too small"):
        LayerReader(FileBlobSource(tmp_path / "tiny"))
