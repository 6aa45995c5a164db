"""ChunkFetcher on trio against a fake blob: single-flight, coalescing, integrity, deadlines."""

from __future__ import annotations

import hashlib
import os
import threading
import time

import pytest
import trio
import zstandard

from rollstack.errors import IntegrityError, RegistryUnavailable
from rollstack.fetch import Account, ChunkFetcher, DiskChunkCache, FetchConfig, MemoryChunkCache, Priority, RemoteLayer
from rollstack.format.toc import Chunk, Compression


class FakeBlob:
    """A layer blob of n zstd chunks with a counting, fault-injectable range read."""

    def __init__(self, n: int = 8, size: int = 50_000) -> None:
        parts, self.chunks, pos = [], [], 0
        cctx = zstandard.ZstdCompressor()
        for i in range(n):
            data = os.urandom(size // 2) + bytes([i]) * (size // 2)
            stored = cctx.compress(data)
            self.chunks.append(Chunk(offset=0, size=len(data), blob_offset=pos, blob_size=len(stored),
                                     digest="sha256:" + hashlib.sha256(data).hexdigest(), compression=Compression.ZSTD))
            self.plain = getattr(self, "plain", []) + [data]
            parts.append(stored)
            pos += len(stored)
        self.blob = bytearray(b"".join(parts))
        self.requests: list[tuple[int, int]] = []
        self.lock = threading.Lock()
        self.fail: Exception | None = None
        self.delay = 0.0
        self.corrupt_times = 0  # serve flipped bytes this many times

    def read(self, off: int, n: int) -> bytes:
        with self.lock:
            self.requests.append((off, n))
            corrupt = self.corrupt_times > 0
            self.corrupt_times -= 1 if corrupt else 0
        if self.delay:
            time.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        data = bytearray(self.blob[off:off + n])
        if corrupt:
            data[len(data) // 2] ^= 0xFF
        return bytes(data)

    def layer(self, index: bool = True) -> RemoteLayer:
        layer = RemoteLayer("repo", "sha256:" + "ab" * 32, self.read, lambda: list(self.chunks))
        if index:
            layer.build_index()
        return layer


def make(tmp_path=None, **cfg) -> ChunkFetcher:
    config = FetchConfig(**{"deadline": 5.0, "retry_initial": 0.01, **cfg})
    disk = DiskChunkCache(tmp_path / "disk", 1 << 30) if tmp_path is not None else None
    return ChunkFetcher(config, MemoryChunkCache(64 << 20), disk)


def run(fn):
    return trio.run(fn)


def test_concurrent_reads_of_one_chunk_fetch_it_once():
    blob = FakeBlob()
    blob.delay = 0.05
    f = make(neighbor_bytes=0)
    layer = blob.layer()
    got = []

    async def main():
        async with f.running():
            async with trio.open_nursery() as n:
                for _ in range(20):
                    async def one():
                        got.append(await f.get(layer, blob.chunks[3]))
                    n.start_soon(one)

    run(main)
    assert got == [blob.plain[3]] * 20
    assert len(blob.requests) == 1
    assert f.metrics.snapshot()["chunks_fetched_more_than_once"] == 0


def test_a_miss_drags_its_neighbours_along_in_one_request():
    blob = FakeBlob()
    f = make(neighbor_bytes=1 << 20)
    layer = blob.layer()

    async def main():
        async with f.running():
            for i, c in enumerate(blob.chunks):
                assert await f.get(layer, c) == blob.plain[i]

    run(main)
    assert len(blob.requests) == 1  # chunk 0 + every following chunk within the window
    snap = f.metrics.snapshot()
    # chunk 0 is served by the GET; the others by that GET's flights (a reader that arrives while
    # its chunk is still being decoded) or from memory
    assert snap["served_chunks"]["registry"] >= 1
    assert snap["served_chunks"]["registry"] + snap["served_chunks"].get("memory", 0) == 8


def test_get_many_coalesces_and_respects_max_request():
    blob = FakeBlob()
    total = sum(c.blob_size for c in blob.chunks)
    f = make(neighbor_bytes=0, max_request=total // 2 + 1)
    layer = blob.layer(index=False)

    async def main():
        async with f.running():
            return await f.get_many(layer, blob.chunks)

    assert run(main) == blob.plain
    assert 2 <= len(blob.requests) <= 3
    assert all(n <= total // 2 + 1 for _, n in blob.requests)


def test_corrupt_bytes_refetch_once_then_integrity_error():
    blob = FakeBlob()
    f = make(neighbor_bytes=0)
    layer = blob.layer()
    blob.corrupt_times = 1  # a transient flip: the refetch heals it

    async def transient():
        async with f.running():
            return await f.get(layer, blob.chunks[0])

    assert run(transient) == blob.plain[0]
    blob.corrupt_times = 100  # persistent corruption

    async def persistent():
        async with f.running():
            with pytest.raises(IntegrityError):
                await f.get(layer, blob.chunks[1])

    run(persistent)
    assert blob.chunks[1].digest not in f.memory
    events = [e for e in f.metrics.snapshot()["events"] if e["type"] == "integrity_error"]
    assert len(events) == 1 and events[0]["chunk"] == blob.chunks[1].digest


def test_registry_down_fails_after_the_deadline_then_recovers():
    blob = FakeBlob()
    f = make(neighbor_bytes=0, deadline=0.3)
    layer = blob.layer()
    blob.fail = ConnectionError("refused")

    async def down():
        async with f.running():
            t0 = trio.current_time()
            with pytest.raises(RegistryUnavailable):
                await f.get(layer, blob.chunks[2])
            return trio.current_time() - t0

    assert run(down) >= 0.3
    assert len(blob.requests) > 2  # it retried
    blob.fail = None

    async def back():
        async with f.running():
            return await f.get(layer, blob.chunks[2])

    assert run(back) == blob.plain[2]


def test_a_hung_registry_is_abandoned_at_the_deadline():
    blob = FakeBlob()
    blob.delay = 3.0
    f = make(neighbor_bytes=0, deadline=0.3)
    layer = blob.layer()

    async def main():
        async with f.running():
            with pytest.raises(RegistryUnavailable):
                await f.get(layer, blob.chunks[0])

    t0 = time.monotonic()
    run(main)
    assert time.monotonic() - t0 < 3.0


def test_disk_tier_serves_after_restart(tmp_path):
    blob = FakeBlob()
    layer = blob.layer()

    async def read_all(f):
        async with f.running():
            out = [await f.get(layer, c) for c in blob.chunks]
        return out  # leaving `running` waits for the disk writes

    assert run(lambda: read_all(make(tmp_path))) == blob.plain
    n = len(blob.requests)
    fresh = make(tmp_path)
    assert run(lambda: read_all(fresh)) == blob.plain
    assert len(blob.requests) == n
    assert fresh.metrics.snapshot()["served_chunks"]["disk"] > 0


def test_prefetch_and_fill_make_reads_local():
    blob = FakeBlob(n=12)
    f = make(neighbor_bytes=0, background_request=60_000)
    layer = blob.layer()
    acct = Account()

    async def main():
        async with f.running():
            await f.prefetch(layer, blob.chunks[:4], acct, Priority.PREFETCH)
            await f.fill(layer, acct)
            n = len(blob.requests)
            for i, c in enumerate(blob.chunks):
                assert await f.get(layer, c, acct) == blob.plain[i]
            assert len(blob.requests) == n

    run(main)
    s = acct.summary()
    assert s["prefetch_bytes"] > 0 and s["background_bytes"] > 0 and s["critical_path_bytes"] == 0
    assert s["from_cache_bytes"] == sum(len(p) for p in blob.plain)


def test_leaf_error_prefers_the_typed_error_in_a_group():
    from rollstack.errors import BlobNotFound
    from rollstack.fetch.fetcher import leaf_error

    typed = BlobNotFound("gone")
    group = BaseExceptionGroup("x", [ValueError("a"), BaseExceptionGroup("y", [typed])])
    assert leaf_error(group) is typed
    assert isinstance(leaf_error(ExceptionGroup("z", [KeyError("k")])), KeyError)
    assert leaf_error(typed) is typed


def test_the_chunk_a_read_waits_for_is_decoded_before_its_neighbours():
    """A miss's neighbours ride in the same GET, but the reader is served as soon as its own
    chunk is verified: here neighbour decoding blocks until the reader has its bytes."""
    from rollstack.format import decode_chunk

    blob = FakeBlob(n=6)
    served = threading.Event()

    def decode(c, raw):
        if c.digest != blob.chunks[0].digest:
            assert served.wait(5), "a neighbour was decoded before the demanded chunk was served"
        return decode_chunk(c, raw)

    f = ChunkFetcher(FetchConfig(deadline=5.0, neighbor_bytes=1 << 20), MemoryChunkCache(64 << 20), decode=decode)
    layer = blob.layer()

    async def main():
        async with f.running():
            data = await f.get(layer, blob.chunks[0])
            served.set()
            assert data == blob.plain[0]
            for i, c in enumerate(blob.chunks[1:], 1):  # the neighbours land too, from the same GET
                assert await f.get(layer, c) == blob.plain[i]

    run(main)
    assert len(blob.requests) == 1


def test_disk_writes_wait_for_the_foreground_to_go_quiet(tmp_path):
    """Fetched chunks are queued, not written, while foreground requests keep coming; reads of
    queued chunks never go back to the registry; the queue is written once reads go quiet."""
    blob = FakeBlob(n=6)
    f = make(tmp_path, neighbor_bytes=0, writeback_quiet=0.3)
    layer = blob.layer()

    async def main():
        async with f.running():
            for c in blob.chunks:
                await f.get(layer, c)
                await trio.sleep(0.05)  # a program between two misses
            assert len(f.disk) == 0  # still quiet-waiting
            assert f.writeback_queue()["writeback_chunks"] == len(blob.chunks)
            f.memory.clear()  # evicted from memory while queued: still local
            assert not f.would_fetch(blob.chunks[0])
            assert await f.get(layer, blob.chunks[0]) == blob.plain[0]
            await trio.sleep(0.6)
            assert len(f.disk) == len(blob.chunks)
            assert f.unwritten(blob.chunks[0].digest) is None
            assert f.writeback_queue() == {"writeback_chunks": 0, "writeback_bytes": 0}

    run(main)
    assert len(blob.requests) == len(blob.chunks)


def test_queued_disk_writes_are_flushed_when_the_fetcher_stops(tmp_path):
    blob = FakeBlob(n=4)
    f = make(tmp_path, neighbor_bytes=0, writeback_quiet=60.0)

    async def main():
        async with f.running():
            for c in blob.chunks:
                await f.get(layer, c)
            assert len(f.disk) == 0

    layer = blob.layer()
    run(main)
    assert len(DiskChunkCache(tmp_path / "disk", 1 << 30)) == len(blob.chunks)


def test_dropping_the_queue_forgets_chunks_not_yet_written(tmp_path):
    blob = FakeBlob(n=4)
    f = make(tmp_path, neighbor_bytes=0, writeback_quiet=60.0)
    layer = blob.layer()

    async def main():
        async with f.running():
            for c in blob.chunks:
                await f.get(layer, c)
            f.drop_queued()
            f.memory.clear()
            assert f.would_fetch(blob.chunks[0]) and f.writeback_queue()["writeback_chunks"] == 0
            assert await f.get(layer, blob.chunks[0]) == blob.plain[0]  # fetched again

    run(main)
    assert len(blob.requests) == len(blob.chunks) + 1
    assert len(DiskChunkCache(tmp_path / "disk", 1 << 30)) == 1  # only the re-fetched chunk was queued at stop


def test_prefetch_bridges_small_gaps_in_one_request_demand_reads_do_not():
    blob = FakeBlob(n=6)
    layer = blob.layer()
    sparse = blob.chunks[::2]  # 0, 2, 4: gaps of one chunk (~25 KB stored) between them

    async def main(f):
        async with f.running():
            await f.prefetch(layer, sparse)

    run(lambda: main(make(neighbor_bytes=0, prefetch_gap=64 << 10)))
    assert len(blob.requests) == 1  # one GET spanning the gaps
    blob.requests.clear()
    run(lambda: main(make(neighbor_bytes=0, prefetch_gap=0)))
    assert len(blob.requests) == 3


def test_the_write_back_queue_is_written_at_once_past_its_bound(tmp_path):
    """A long burst (a whole-layer prefetch keeps the foreground busy) must not pile fetched
    chunks up in memory: past `writeback_max` the queue is written without waiting for quiet."""
    blob = FakeBlob(n=12, size=100_000)
    f = make(tmp_path, neighbor_bytes=0, writeback_quiet=60.0, writeback_max=250_000)
    layer = blob.layer()

    async def main():
        async with f.running():
            f.gate.foreground_started()  # the foreground never goes quiet during this test
            for c in blob.chunks:
                await f.get(layer, c)
                await trio.sleep(0.02)
            await trio.sleep(0.3)
            assert f.writeback_queue()["writeback_bytes"] < 250_000 + 100_000
            assert len(f.disk) >= len(blob.chunks) - 3
            f.gate.foreground_finished()

    run(main)


def test_a_long_prefetch_retires_each_chunk_as_it_lands():
    """Flights of a whole-layer prefetch end chunk by chunk (no bytes held until the last
    request lands); a reader that joins a flight still gets the bytes. The registry answers one
    request per `gate.release()`, so nothing here depends on timing."""
    blob = FakeBlob(n=12)
    gate = threading.Semaphore(0)
    read = blob.read

    def gated_read(off: int, n: int) -> bytes:
        assert gate.acquire(timeout=10), "the test never released this request"
        return read(off, n)

    blob.read = gated_read  # type: ignore[method-assign]
    f = make(neighbor_bytes=0, max_request=60_000, foreground_requests=3)  # prefetch: 1 request at a time
    layer = blob.layer()
    seen = []

    got = []

    async def reader():
        got.append(await f.get(layer, blob.chunks[0]))  # joins chunk 0's prefetch flight

    async def main():
        async with f.running():
            async with trio.open_nursery() as n:
                n.start_soon(f.prefetch, layer, blob.chunks)
                await trio.sleep(0.05)
                assert len(f._inflight) == len(blob.chunks)  # noqa: SLF001 - all claimed, none landed
                n.start_soon(reader)
                gate.release()  # one request (two chunks; which one is up to trio's scheduler) lands
                for _ in range(500):
                    if len(f._inflight) < len(blob.chunks):  # noqa: SLF001
                        break
                    await trio.sleep(0.01)
                seen.append(len(f._inflight))  # noqa: SLF001
                gate.release(len(blob.chunks))
            seen.append(len(f._inflight))  # noqa: SLF001

    run(main)
    assert 0 < seen[0] < len(blob.chunks) and seen[1] == 0
    assert got == [blob.plain[0]]


def test_prefetch_reads_scattered_chunks_in_one_multi_range_get_and_verifies_each():
    blob = FakeBlob(n=12)
    multi: list[list[tuple[int, int]]] = []

    def read_ranges(spans):
        multi.append(list(spans))
        return [bytes(blob.blob[o:o + n]) for o, n in spans]

    layer = blob.layer()
    layer.read_ranges, layer.multi_range = read_ranges, lambda: True
    f = make(multi_range_gap=0)
    wanted = blob.chunks[::3]  # scattered: no two adjacent

    async def main():
        async with f.running():
            await f.prefetch(layer, wanted)
            for c in wanted:
                assert f.cached(c) is not None
            blob.corrupt_times = 0

    run(main)
    assert len(multi) == 1 and len(multi[0]) == len(wanted) and blob.requests == []  # one GET, no single reads
    # a store that cannot: one GET per run of chunks, as before
    layer2 = blob.layer()
    layer2.read_ranges, layer2.multi_range = read_ranges, lambda: False
    f2 = make(prefetch_gap=0)

    async def main2():
        async with f2.running():
            await f2.prefetch(layer2, wanted)

    run(main2)
    assert len(multi) == 1 and len(blob.requests) == len(wanted)


def test_a_corrupt_chunk_in_a_multi_range_answer_is_refetched_alone():
    blob = FakeBlob(n=6)
    bad = blob.chunks[2]

    def read_ranges(spans):
        out = [bytearray(blob.blob[o:o + n]) for o, n in spans]
        for (o, n), b in zip(spans, out):
            if o <= bad.blob_offset < o + n:
                b[bad.blob_offset - o] ^= 0xFF
        return [bytes(b) for b in out]

    layer = blob.layer()
    layer.read_ranges, layer.multi_range = read_ranges, lambda: True
    f = make(multi_range_gap=0)

    async def main():
        async with f.running():
            await f.prefetch(layer, blob.chunks[::2])
            return [f.cached(c) for c in blob.chunks[::2]]

    got = run(main)
    assert got == [blob.plain[i] for i in range(0, 6, 2)]  # verified bytes only
    assert blob.requests == [(bad.blob_offset, bad.blob_size)]  # the bad one, alone, from the single-range path
