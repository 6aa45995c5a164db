"""`convert()` of a gzip tarball file, decompressed by each decoder child (`igzip -dc`, `pigz -dc`;
format.tarstream) and by the zlib thread: the same layer as the uncompressed path, and a corrupt
stream (bad data, bad CRC trailer, truncation) is refused."""

from __future__ import annotations

import gzip
import importlib
import os
from pathlib import Path

import pytest

from components import require_tool
from rollstack.errors import SourceInvalid
from rollstack.format import tarstream

convert_mod = importlib.import_module("rollstack.format.convert")


@pytest.fixture(params=["igzip", "pigz", "thread"], autouse=True)
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(tarstream, "GZIP_DECODER", request.param)
    if request.param != "thread":
        require_tool(request.param)
        assert (tarstream.gzip_child() or [""])[0] == request.param
    return request.param


def test_each_decoder_gives_the_same_layer_as_the_uncompressed_path(tmp_path: Path, make_ti, make_tar) -> None:
    tar = make_tar([(make_ti("d/f", mode=0o640), os.urandom(300_000)), (make_ti("g"), b"g" * 5000)])
    (tmp_path / "l.tar.gz").write_bytes(gzip.compress(tar))
    (tmp_path / "l.tar").write_bytes(tar)
    gzipped = convert_mod.convert(tmp_path / "l.tar.gz", tmp_path / "a.blob")
    plain = convert_mod.convert(tmp_path / "l.tar", tmp_path / "b.blob")
    assert (tmp_path / "a.blob").read_bytes() == (tmp_path / "b.blob").read_bytes()
    assert gzipped.digest == plain.digest


def test_a_corrupt_gzip_file_is_refused(tmp_path: Path, make_ti, make_tar) -> None:
    gz = bytearray(gzip.compress(make_tar([(make_ti("f"), os.urandom(200_000))])))
    bad_crc = bytearray(gz)
    bad_crc[-6] ^= 0xFF  # the CRC32 trailer
    flipped = bytearray(gz)
    flipped[len(gz) // 2] ^= 0xFF
    for i, data in enumerate((bytes(bad_crc), bytes(flipped), bytes(gz[: len(gz) // 2]))):
        src = tmp_path / f"bad{i}.tar.gz"
        src.write_bytes(data)
        with pytest.raises(SourceInvalid):
            convert_mod.convert(src, tmp_path / f"bad{i}.blob")
        assert not (tmp_path / f"bad{i}.blob").exists()


@pytest.mark.parametrize("buffering", [0, -1, 4096])
def test_convert_tar_reads_a_gzip_file_opened_any_way(tmp_path: Path, make_ti, make_tar, buffering: int) -> None:
    """A child decoder reads the file's descriptor itself: a buffered reader's read-ahead of the magic bytes
    must not move where it starts (it did: 'empty file' or a stream cut at the buffer's end)."""
    import io

    tar = make_tar([(make_ti("d/f"), os.urandom(200_000)), (make_ti("g"), b"g" * 5000)])
    (tmp_path / "l.tar.gz").write_bytes(b"\0" * 100 + gzip.compress(tar))  # not at offset 0 either
    expected = io.BytesIO()
    convert_mod.convert_tar(io.BytesIO(tar), expected)
    out = io.BytesIO()
    with open(tmp_path / "l.tar.gz", "rb", buffering=buffering) as f:
        f.seek(100)
        convert_mod.convert_tar(f, out)
    assert out.getvalue() == expected.getvalue()
