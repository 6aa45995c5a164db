"""ChunkFetcher.start (fetch at open): the later read joins the flight, one request in all."""

from __future__ import annotations

import trio

from rollstack.fetch import Account

from test_fetch_fetcher import FakeBlob, make  # noqa: E402 - shared fakes of the fetcher tests


def test_start_then_read_is_one_request_and_counts_one_read():
    blob = FakeBlob(n=4)
    blob.delay = 0.05
    f = make(neighbor_bytes=0)
    layer = blob.layer()
    acct = Account()

    async def main():
        async with f.running():
            assert f.start(layer, blob.chunks[0], acct) is True
            assert f.start(layer, blob.chunks[0], acct) is False  # already in flight
            assert await f.get(layer, blob.chunks[0], acct) == blob.plain[0]
            assert f.start(layer, blob.chunks[0], acct) is False  # in memory now

    trio.run(main)
    assert len(blob.requests) == 1
    s = acct.summary()
    assert s["reads"] == 1 and s["critical_path_bytes"] == blob.chunks[0].blob_size
