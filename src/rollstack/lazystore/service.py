"""`LazyStoreService`: the daemon's state and operations, independent of FUSE and HTTP.

A composition of owned parts, each in its module:

    layers   LayerTable    (layers.py)  loaded layers, their inode ranges, the takeover record
    reads    Reads         (reads.py)   file reads, readahead, directory prefetch, chunks for peers
    traces   TraceBook     (traces.py)  local and shared access traces: lookup, prefetch, saving
    envs     Environments  (envs.py)    environments: accounts, trace work, background fill
    stats                  (stats.py)   the node-wide statistics document

and the chunk data path they share (`fetch`: caches, peers, `ChunkFetcher`). The FUSE
operations (`mount.fs`, attached as the `frontend`) and the control API (`mount.control`) are
thin adapters over the public methods here. Runs on the daemon's trio loop, which also serves
FUSE: every blocking file or network access goes to a worker thread.
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Protocol

import trio

from rollstack.fetch import (ChunkFetcher, DiskChunkCache, FetchMetrics, MemoryChunkCache, PeerClient, Priority,
                             TraceStore)
from rollstack.lazystore import stats as stats_doc
from rollstack.lazystore.config import DaemonConfig
from rollstack.lazystore.envs import Env, Environments, EnvTable
from rollstack.lazystore.layers import LayerTable, LoadedLayer, NoXattrHook
from rollstack.lazystore.reads import Reads
from rollstack.lazystore.traces import TraceBook


class Frontend(Protocol):
    """What the service reads from the FUSE layer that serves it (mount.fs.LazyFS)."""

    ops: dict[str, int]
    """FUSE requests served, by operation."""
    mode: dict[str, Any]
    """How it serves (no-open mode, patched pyfuse3, xattr fast path, takeover, ...)."""

    def fast_stats(self) -> dict[str, int] | None:
        """Counters of the patched pyfuse3's C fast path, or None without it."""

    def no_xattr_hook(self) -> NoXattrHook | None:
        """Where to declare the inodes that have no xattrs, or None without the fast path."""

    def activity(self) -> int:
        """A count of the requests it has served (moves while programs read)."""


class LazyStoreService:
    def __init__(self, config: DaemonConfig, store: Any, *, decode: Any = None) -> None:
        self.config = config
        self.store = store
        fc = config.fetch
        self.metrics = FetchMetrics()
        self.memory = MemoryChunkCache(fc.memory_budget)
        self.disk = DiskChunkCache(config.state_dir / "chunks", fc.disk_budget)
        self.peers = PeerClient(config.peers, timeout=fc.peer_timeout, dead_for=fc.peer_dead_for) if config.peers else None
        self.fetcher = ChunkFetcher(fc, self.memory, self.disk, self.peers, self.metrics, decode)
        self.layers = LayerTable(store, config.mountpoint, config.state_dir, self.fetcher.spawn)
        self.envs = EnvTable()
        self.reads = Reads(fc, self.layers, self.envs, self.fetcher, self.memory, self.disk)
        self.traces = TraceBook(TraceStore(config.state_dir / "traces"), store, self.layers, self.fetcher,
                                share=config.share_traces, max_chunks=fc.trace_max_chunks)
        self.environments = Environments(self.envs, self.layers, self.traces, self.fetcher, fc)
        self.started = time.time()
        self.frontend: Frontend | None = None

    def attach(self, frontend: Frontend) -> None:
        """The FUSE layer serving this service (its counters feed `stats` and the fetcher's
        write-back timing, its xattr fast path learns the inodes without xattrs)."""
        self.frontend = frontend
        self.fetcher.activity = frontend.activity  # write-back waits for reads to go quiet
        self.layers.no_xattr_hook = frontend.no_xattr_hook()
        self.layers.publish_xattr_ranges()

    # -- layers ----------------------------------------------------------------------------
    async def add_layers(self, refs: Iterable[Any]) -> dict[str, Any]:
        return await self.layers.add(refs)

    async def fetch_all(self, refs: Iterable[Any], background: bool = False) -> dict[str, Any]:
        """Every chunk of these layers made local: at prefetch priority, or `background`: as
        gated background fill (`ChunkFetcher.fill`, one layer after the other)."""
        t0 = time.perf_counter()
        added = await self.add_layers(refs)
        before = self.metrics.snapshot()["transferred_bytes"].get("registry", 0)
        if background:
            for doc in added["layers"]:
                await self.fetcher.fill(self.layers.loaded(doc["digest"]).remote)
        else:
            async with trio.open_nursery() as n:
                for doc in added["layers"]:
                    n.start_soon(self._fetch_layer, self.layers.loaded(doc["digest"]))
        after = self.metrics.snapshot()["transferred_bytes"].get("registry", 0)
        return {"seconds": round(time.perf_counter() - t0, 6), "fetched_bytes": after - before,
                "stack_bytes": sum(d["blob_size"] for d in added["layers"])}

    async def _fetch_layer(self, layer: LoadedLayer) -> None:
        await trio.to_thread.run_sync(layer.remote.build_index)
        await self.fetcher.prefetch(layer.remote, layer.remote.chunks or (), None, Priority.PREFETCH)

    # -- environments ----------------------------------------------------------------------
    async def begin_env(self, env_id: str, refs: Iterable[Any], trace_key: str | None = None,
                        background: bool = True, fallback_key: str | None = None) -> dict[str, Any]:
        """Register an environment on these layers and start its trace work (lazystore/envs.py)."""
        return await self.environments.begin(env_id, refs, trace_key, background, fallback_key)

    async def begin_envs(self, env_ids: list[str], refs: Iterable[Any], trace_key: str | None = None,
                         background: bool = True, fallback_key: str | None = None) -> dict[str, Any]:
        """`begin_env` for the environments of one group at once (lazystore/envs.py)."""
        return await self.environments.begin_many(env_ids, refs, trace_key, background, fallback_key)

    async def end_env(self, env_id: str) -> dict[str, Any]:
        return await self.environments.end(env_id)

    async def share_trace(self, env_id: str, keys: list[str]) -> int:
        """The environment's reads so far stored and published as the traces of `keys`."""
        return await self.environments.share_trace(env_id, keys)

    def env_stats(self, env_id: str) -> dict[str, Any]:
        return self.environments.get(env_id).stats()

    async def prefetch_trace(self, trace_key: str, env_id: str | None = None) -> int:
        """Prefetch this node's stored trace of `trace_key` now (into `env_id`'s account, if it
        is known); the number of chunks in it."""
        trace = await self.traces.local(trace_key)
        env = self.envs.envs.get(env_id) if env_id else None
        if trace:
            await self.traces.prefetch(trace, (env or Env("prefetch", [])).account)
        return len(trace)

    # -- node ------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        return stats_doc.node_stats(self)

    def update_metric_gauges(self) -> None:
        stats_doc.update_gauges(self)

    def set_peers(self, urls: list[str], self_url: str | None = None) -> list[str]:
        """Replace the peers asked before the registry (a cluster's members come and go);
        `self_url`, this daemon's own peer URL, orders the nodes (see PeerClient)."""
        fc = self.config.fetch
        if self.peers is None:
            self.peers = PeerClient(urls, timeout=fc.peer_timeout, dead_for=fc.peer_dead_for, self_url=self_url)
        else:
            self.peers.set_urls(urls, self_url)
        self.fetcher.peers = self.peers if self.peers.urls else None
        return list(self.peers.urls)

    async def drop_caches(self) -> None:
        """Empty the memory and disk chunk caches (benchmarks); the disk's files are unlinked
        in a worker thread."""
        self.fetcher.drop_queued()
        self.memory.clear()
        await trio.to_thread.run_sync(self.disk.clear)
