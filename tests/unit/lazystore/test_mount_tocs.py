"""TocCache: opening a layer costs one size query + a tail read, and nothing the second time."""

from __future__ import annotations

import pytest

from rollstack.errors import FormatError
from rollstack.format import convert
from rollstack.lazystore.tocs import TocCache


def test_toc_is_cached_on_disk_and_reverified(tmp_path):
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    for i in range(50):
        (src / "d" / f"f{i}").write_text(f"file {i}\n" * 100)
    info = convert(src, tmp_path / "layer.blob")
    blob = (tmp_path / "layer.blob").read_bytes()
    calls = []

    def read(off: int, n: int) -> bytes:
        calls.append((off, n))
        return blob[off:off + n]

    cache = TocCache(tmp_path / "tocs")
    first = cache.open(info.digest, lambda: len(blob), read)
    assert not first.cached and first.requests == 1 + len(calls) and len(calls) <= 2
    assert len(first.toc) == info.entries
    again = cache.open(info.digest, lambda: pytest.fail("size queried"), lambda o, n: pytest.fail("read"))
    assert again.cached and again.requests == 0 and again.toc.paths == first.toc.paths

    # a damaged cache file is ignored (the footer/TOC digests are re-checked) and refetched
    path = tmp_path / "tocs" / (info.digest.split(":")[1] + ".tail")
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0xFF
    path.write_bytes(bytes(raw))
    healed = cache.open(info.digest, lambda: len(blob), read)
    assert not healed.cached and healed.toc.paths == first.toc.paths


def test_corrupt_blob_toc_raises(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_text("x")
    info = convert(src, tmp_path / "layer.blob")
    blob = bytearray((tmp_path / "layer.blob").read_bytes())
    blob[-(info.toc_size // 2) - 100] ^= 0xFF
    with pytest.raises(FormatError):
        TocCache(tmp_path / "tocs").open(info.digest, lambda: len(blob), lambda o, n: bytes(blob[o:o + n]))
