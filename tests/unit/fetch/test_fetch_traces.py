"""`TraceChunk`, `TraceRecorder`, `TraceStore`: the one typed form of a trace and its files."""

from __future__ import annotations

import json

import pytest

from rollstack.errors import InvalidRequest
from rollstack.fetch import TraceChunk, TraceRecorder, TraceStore
from rollstack.format.toc import Chunk, Compression

L = "sha256:" + "a" * 64
D = "sha256:" + "c" * 64


def c(bo: int) -> Chunk:
    return Chunk(offset=0, size=10, blob_offset=bo, blob_size=5, digest=D, compression=Compression.ZSTD)


def test_the_document_form_round_trips_and_is_checked():
    t = TraceChunk(L, c(7))
    assert t.to_doc() == [L, {"o": 0, "s": 10, "bo": 7, "bs": 5, "d": D, "c": "zstd"}]
    assert TraceChunk.from_doc(json.loads(json.dumps(t.to_doc()))) == t
    assert TraceChunk.from_doc(t.to_doc(), blob_size=12) == t
    with pytest.raises(InvalidRequest, match="outside its layer blob"):
        TraceChunk.from_doc(t.to_doc(), blob_size=11)


def test_the_recorder_keeps_first_reads_once_within_its_window_and_bound():
    rec = TraceRecorder("k", window=60.0, max_chunks=2)
    for bo in (3, 1, 3, 2):
        rec.record(L, c(bo))
    assert [t.chunk.blob_offset for t in rec.chunks.values()] == [3, 1]
    closed = TraceRecorder("k", window=-1.0, max_chunks=10)
    closed.record(L, c(1))
    assert not closed.chunks and not closed.open


def test_the_store_merges_in_first_seen_order_and_ignores_unreadable_files(tmp_path):
    store = TraceStore(tmp_path)
    rec = TraceRecorder("k", 60.0, 100)
    rec.record(L, c(1))
    assert store.save(rec) == 1
    assert store.put("k", [TraceChunk(L, c(2)), TraceChunk(L, c(1))], 100) == 2
    assert [t.chunk.blob_offset for t in store.load("k")] == [1, 2]
    assert store.load("other") == []
    store._path("k").write_text('{"key": "k", "chunks": [["x", {"bo": -1}]]}')  # noqa: SLF001
    assert store.load("k") == []
    store._path("k").write_text("not json")  # noqa: SLF001
    assert store.load("k") == []
