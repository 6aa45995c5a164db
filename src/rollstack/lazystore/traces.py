"""`TraceBook`: the lazy store's access traces, this node's and the ones other nodes shared.

Lookup: a key's trace is this node's (`fetch.traces.TraceStore`, one file per key under
`<state_dir>/traces`), else one another node published to the artifact store
(`fetch.shared_traces`, validated against the asking stack, bounded by SHARED_TRACE_TIMEOUT);
a shared trace found is kept locally. Saving merges a recorder into the stored trace and
publishes the result in a thread of its own (best effort).

Every file and store access runs in a worker thread, never on the loop that serves FUSE; the
writes (read-modify-write merges) go one at a time.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Mapping

import trio

from rollstack.fetch import ChunkFetcher, Trace, TraceRecorder, TraceStore
from rollstack.fetch import shared_traces
from rollstack.fetch.stats import Account
from rollstack.fetch.waves import prefetch_trace
from rollstack.lazystore.layers import LayerTable

log = logging.getLogger("rollstack.lazystore.traces")

SHARED_TRACE_TIMEOUT = 2.0  # seconds a shared trace lookup may take before it counts as an error


class TraceBook:
    def __init__(self, store: TraceStore, artifacts: Any, layers: LayerTable, fetcher: ChunkFetcher, *,
                 share: bool, max_chunks: int) -> None:
        self.store = store
        self.artifacts = artifacts  # the ArtifactStore traces are shared through
        self.layers, self.fetcher = layers, fetcher
        self.share, self.max_chunks = share, max_chunks
        self._writes = trio.Lock()
        self.shared = {"hits": 0, "misses": 0, "errors": 0, "published": 0, "publish_errors": 0}

    # -- lookup ------------------------------------------------------------------------------
    async def local(self, key: str) -> Trace:
        """This node's trace of `key` ([] if none)."""
        return await trio.to_thread.run_sync(self.store.load, key)

    async def shared_trace(self, key: str, sizes: Mapping[str, int]) -> Trace:
        """The trace another node published for `key`, validated against this stack (`sizes`:
        layer digest -> blob size) and kept locally; [] when sharing is off, there is none, it is
        invalid or the store does not answer within SHARED_TRACE_TIMEOUT."""
        if not self.share:
            return []
        trace: Trace | None = None
        try:
            with trio.move_on_after(SHARED_TRACE_TIMEOUT) as scope:
                trace = await trio.to_thread.run_sync(shared_traces.lookup, self.artifacts, key, sizes,
                                                      abandon_on_cancel=True)
        except Exception as exc:  # noqa: BLE001 - best effort: an unusable trace costs only speed
            log.info("shared trace for %r ignored: %s", key, exc)
            self.shared["errors"] += 1
            return []
        if scope.cancelled_caught:
            log.info("shared trace lookup for %r timed out", key)
            self.shared["errors"] += 1
            return []
        if not trace:
            self.shared["misses"] += 1
            return []
        self.shared["hits"] += 1
        self.fetcher.spawn(self._write, self.store.put, key, trace, self.max_chunks)  # kept, off the way
        return trace

    # -- prefetch ----------------------------------------------------------------------------
    async def prefetch(self, trace: Trace, account: Account | None) -> None:
        """Fetch a trace's chunks of this node's layers in growing waves (`fetch.waves.prefetch_trace`)."""
        known = [(self.layers.get(t.layer.partition(":")[2]), t) for t in trace]
        await prefetch_trace(self.fetcher, [(layer.remote, t.chunk) for layer, t in known if layer is not None], account)

    # -- saving ------------------------------------------------------------------------------
    async def save(self, rec: TraceRecorder, also: str | None = None) -> None:
        """Merge a recording into its key's stored trace (and into `also`'s: the stack trace all
        tasks share), then publish what was saved."""
        if not rec.chunks:
            return

        def merge() -> dict[str, Trace]:
            self.store.save(rec)
            saved = {rec.key: self.store.load(rec.key)}
            if also:
                self.store.put(also, saved[rec.key], self.max_chunks)
                saved[also] = self.store.load(also)  # merged with earlier tasks'
            return saved

        self._publish_all(await self._write(merge))

    async def put(self, keys: list[str], trace: Trace) -> None:
        """Merge `trace` into each of `keys`' stored traces, then publish what was saved (a
        snapshot's stack starts with what its parent read)."""
        def write() -> dict[str, Trace]:
            saved = {}
            for key in keys:
                self.store.put(key, trace, self.max_chunks)
                saved[key] = self.store.load(key)
            return saved

        self._publish_all(await self._write(write))

    def _publish_all(self, saved: dict[str, Trace]) -> None:
        if self.share:
            for key, entries in saved.items():
                threading.Thread(target=self._publish, args=(key, entries), daemon=True,
                                 name="publish-trace").start()

    async def _write(self, fn: Callable[..., Any], *args: Any) -> Any:
        async with self._writes:
            return await trio.to_thread.run_sync(fn, *args)

    def _publish(self, key: str, entries: Trace) -> None:
        """Worker thread, best effort: a store that refuses or fails only loses the sharing."""
        try:
            shared_traces.publish(self.artifacts, key, entries)
            self.shared["published"] += 1
        except Exception as exc:  # noqa: BLE001
            self.shared["publish_errors"] += 1
            log.warning("could not publish the trace of %r: %s", key, exc)
