"""Background fill is low priority: the token bucket (pure) and the gate inside ChunkFetcher."""

from __future__ import annotations

import trio

from rollstack.fetch import Account
from rollstack.fetch.background import BackgroundGate, TokenBucket

from test_fetch_fetcher import FakeBlob, make  # noqa: E402 - shared fakes of the fetcher tests


def test_token_bucket_admits_at_its_rate():
    b = TokenBucket(rate=1000.0, burst=500.0, tokens=500.0, stamp=0.0)
    assert b.wait_for(500, 0.0) == 0.0  # the burst
    assert b.wait_for(100, 0.0) == 0.1  # empty: 100 bytes take 0.1 s at 1000 B/s
    assert b.wait_for(100, 0.1) == 0.0
    # bigger than the burst: admitted once the bucket is full, then in debt
    assert b.wait_for(2000, 0.1) == 0.5
    assert b.wait_for(2000, 0.6) == 0.0
    assert b.tokens < 0
    assert TokenBucket(rate=0, burst=0).wait_for(10**9, 0.0) == 0.0  # 0 = unlimited


def test_gate_waits_for_foreground_and_quiet_period():
    async def main():
        gate = BackgroundGate(rate=0, quiet=0.2)
        order = []

        async def background():
            await gate.admit(100)
            order.append(("bg", gate.active, trio.current_time()))

        async with trio.open_nursery() as n:
            gate.foreground_started()
            n.start_soon(background)
            await trio.sleep(0.1)
            assert order == []  # foreground in flight: nothing admitted
            gate.foreground_finished()
            ended = trio.current_time()
        assert order[0][1] == 0 and order[0][2] - ended >= 0.2 - 1e-3
        assert gate.paused == 1 and gate.started_during_foreground == 0

    trio.run(main)


def test_fill_transfers_nothing_while_foreground_reads_run():
    blob = FakeBlob(n=16)
    blob.delay = 0.03
    f = make(neighbor_bytes=0, background_request=60_000, background_quiet=0.15, background_share=0.0)
    layer = blob.layer()
    acct = Account()
    during: list[int] = []

    async def main():
        async with f.running():
            async with trio.open_nursery() as n:
                n.start_soon(f.fill, layer, acct)
                for c in blob.chunks[:6]:  # a burst of serial demand misses, like imports
                    await f.get(layer, c, acct)
                    during.append(acct.summary()["background_bytes"])
            for i, c in enumerate(blob.chunks):
                assert await f.get(layer, c, acct) == blob.plain[i]

    trio.run(main)
    assert during == [0] * 6  # not one background byte while the burst ran
    s = acct.summary()
    assert s["background_bytes"] > 0  # ... and the fill completed afterwards
    assert f.gate.paused >= 1 and f.gate.started_during_foreground == 0
    assert f.metrics.snapshot()["transferred_bytes"]["background"] == s["background_bytes"]
    # the rest of the layer came from the fill: every chunk is on disk or was demanded
    assert s["critical_path_bytes"] + s["background_bytes"] >= sum(c.blob_size for c in blob.chunks)


def test_background_chunks_skip_the_memory_cache(tmp_path):
    blob = FakeBlob(n=6)
    f = make(tmp_path, neighbor_bytes=0, background_request=60_000, background_quiet=0.0, background_share=0.0)
    layer = blob.layer()

    async def main():
        async with f.running():
            await f.fill(layer, None)
            assert len(f.memory) == 0  # fill must not evict what programs use
            assert all(c.digest in f.disk for c in blob.chunks)  # written by the worker thread
            n = len(blob.requests)
            for i, c in enumerate(blob.chunks):
                assert await f.get(layer, c, None) == blob.plain[i]
            assert len(blob.requests) == n

    trio.run(main)
    assert f.metrics.snapshot()["served_chunks"]["disk"] == 6


def test_background_requests_run_at_idle_cpu_priority_and_demand_reads_do_not(tmp_path):
    import os
    import threading

    from rollstack.fetch.background import IDLE_NICE, idle_thread

    blob = FakeBlob(n=6)
    f = make(tmp_path, neighbor_bytes=0, background_request=60_000, background_quiet=0.0, background_share=0.0)
    layer = blob.layer()
    seen: list[tuple[str, int]] = []
    inner = layer.read_range

    def read_range(offset, length):
        seen.append((threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, 0)))
        return inner(offset, length)

    layer.read_range = read_range

    async def main():
        async with f.running():
            await f.get(layer, blob.chunks[0], None)  # a demand read
            demand = len(seen)
            await f.fill(layer, None)
            return demand

    base = os.getpriority(os.PRIO_PROCESS, 0)  # 0, or what `nice` started the tests at
    demand = trio.run(main)
    assert demand >= 1 and all(p == base for _, p in seen[:demand])
    assert len(seen) > demand and all(p == IDLE_NICE for _, p in seen[demand:])
    # the worker threads are back at their own priority afterwards
    with idle_thread():
        assert os.getpriority(os.PRIO_PROCESS, 0) == IDLE_NICE
    assert os.getpriority(os.PRIO_PROCESS, 0) == base


class _Meter:
    window = 0.05

    def __init__(self, values):
        self.values = list(values)

    def idle(self):
        return self.values.pop(0) if len(self.values) > 1 else self.values[0]


def test_gate_waits_while_the_nodes_cpus_are_busy():
    async def main():
        meter = _Meter([0.1, 0.2, 0.3, 1.5])  # busy three checks, then 1.5 cores idle
        gate = BackgroundGate(rate=0, quiet=0.0, min_idle=0.5, meter=meter)
        t0 = trio.current_time()
        await gate.admit(100)
        assert gate.cpu_waits == 3 and gate.paused == 1 and gate.admitted == 1
        assert trio.current_time() - t0 >= 3 * meter.window - 1e-3
        assert gate.snapshot()["cpu_waits"] == 3
        free = BackgroundGate(rate=0, quiet=0.0, min_idle=0.0)  # the condition off: no meter
        await free.admit(100)
        assert free.cpu_waits == 0 and free.meter is None

    trio.run(main)
