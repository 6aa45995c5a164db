"""The parallel converter writes the serial converter's bytes; both gzip decoders agree and fail alike."""

from __future__ import annotations

import gzip
import io
import os

import pytest

from components import require_tool
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollstack.errors import SourceInvalid
from rollstack.format import BytesBlobSource, LayerReader, convert_tar
from rollstack.format import tarstream

from test_format_properties import _to_tar, trees
from format_tar_helpers import tar_bytes, ti


def _convert(data: bytes, threads: int, chunk_size: int = 4096, stream: bool = False) -> bytes:
    out = io.BytesIO()

    class Pipe(io.RawIOBase):  # not seekable, no fileno: pigz is fed by a thread
        def __init__(self) -> None:
            self._b = io.BytesIO(data)

        def readable(self) -> bool:
            return True

        def readinto(self, b) -> int:  # type: ignore[override]
            return self._b.readinto(b)

    src = Pipe() if stream else io.BytesIO(data)
    convert_tar(src, out, chunk_size=chunk_size, threads=threads)  # type: ignore[arg-type]
    return out.getvalue()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=trees(), chunk_size=st.sampled_from([4096, 1 << 20]), threads=st.sampled_from([2, 3, 8]))
def test_any_thread_count_gives_the_serial_bytes(specs, chunk_size: int, threads: int) -> None:
    tar = _to_tar(specs)
    assert _convert(tar, threads, chunk_size) == _convert(tar, 1, chunk_size)


def test_duplicate_chunks_across_batches_are_stored_once_at_the_first_position() -> None:
    rnd = [os.urandom(4096) for _ in range(8)]
    members = [(ti(f"f{i}"), b"".join(rnd[(i + k) % 8] for k in range(40))) for i in range(30)]
    members += [(ti("same-as-f0"), members[0][1]), (ti("zeros"), b"\0" * 300_000)]
    tar = tar_bytes(members)
    serial = _convert(tar, 1)
    assert _convert(tar, 4) == serial
    r = LayerReader(BytesBlobSource(serial))
    # 8 random chunks + a full zero chunk + the zero file's short tail
    assert len({c.blob_offset for e in r.toc.entries for c in e.chunks}) == 8 + 2
    assert r.read("same-as-f0") == members[0][1]


@pytest.mark.parametrize("decoder", ["igzip", "pigz", "thread"])
@pytest.mark.parametrize("stream", [False, True])
def test_gzip_decoders(monkeypatch, decoder: str, stream: bool) -> None:
    monkeypatch.setattr(tarstream, "GZIP_DECODER", decoder)
    if decoder != "thread":  # the child must be the one asked for, not a silent thread fallback
        require_tool(decoder)
        assert (tarstream.gzip_child() or [""])[0] == decoder
    tar = tar_bytes([(ti("a"), os.urandom(200_000)), (ti("b"), b"b" * 5000)])
    want = _convert(tar, 1)
    gz = gzip.compress(tar)
    assert _convert(gz, 2, stream=stream) == want
    two_members = gzip.compress(tar[:10_000]) + gzip.compress(tar[10_000:]) + b"\0" * 64  # as gzip(1) accepts
    assert _convert(two_members, 2, stream=stream) == want
    bad = bytearray(gz)
    bad[len(bad) // 2] ^= 0xFF
    for broken in (bytes(bad), gz[:-4], gz[: len(gz) // 2], gz[:-8] + b"\0" * 8):
        with pytest.raises(SourceInvalid):
            _convert(broken, 2, stream=stream)
