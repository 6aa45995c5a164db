"""`LazyStoreService`: the daemon's state and operations, independent of FUSE and HTTP.

Owns the loaded layers (one `LayerIndex` + `RemoteLayer` each, one inode range each), the open
files, the environments (accounts, traces, background fill) and the `ChunkFetcher`. The FUSE
operations (`mount.fs`) and the control API (`mount.control`) are thin adapters over it.
Runs on the daemon's trio loop; blocking work goes to threads.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import trio

from rollstack.errors import InvalidRequest, NotFound
from rollstack.fetch import (ChunkFetcher, DiskChunkCache, FetchConfig, FetchMetrics, MemoryChunkCache, PeerClient,
                             Priority, RemoteLayer, TraceRecorder, TraceStore)
from rollstack.fetch import shared_traces
from rollstack.fetch.waves import plan_waves
from rollstack.store import byteranges
from rollstack.format.toc import Chunk, Compression, EntryType, TocEntry
from rollstack.mount.envs import Env, EnvTable
from rollstack.mount.index import LayerIndex
from rollstack.mount.tocs import TocCache

log = logging.getLogger("rollstack.mount.service")

FIRST_LAYER_INODE = 1000
READAHEAD_BATCH = 4 << 20  # stored bytes: the smallest readahead top-up
UNOPENED_STATES = 4096  # no-open mode: per-inode read states kept (sequential-read detection)
SHARED_TRACE_TIMEOUT = 2.0  # seconds begin_env waits at most for a shared trace lookup
SMALL_LAYER = 5000
PREPARE_DELAY = 5.0  # seconds after adding a big layer before its hardlink scan  # entries: below this, hardlink counts are computed while adding the layer


@dataclass(frozen=True)
class DaemonConfig:
    mountpoint: Path
    state_dir: Path
    store: str
    fetch: FetchConfig = field(default_factory=FetchConfig)
    peers: tuple[str, ...] = ()
    control: Path | None = None
    """Unix socket of the control API (default: <state_dir>/control.sock)."""
    listen: str | None = None
    """Optional TCP address (127.0.0.1:PORT) serving the same API, for peers."""
    entry_timeout: float = 86400.0
    """Seconds the kernel may cache entries, attributes and negative lookups of layer content."""
    share_traces: bool = True
    """Publish new access traces to the artifact store and look them up on a local miss."""
    no_open: bool = True
    """Answer the first OPEN and OPENDIR with ENOSYS, so the kernel stops sending OPEN, RELEASE,
    OPENDIR and RELEASEDIR and caches directory listings (needs the patched pyfuse3,
    third_party/pyfuse3; without it the daemon serves opens as before)."""
    holder_grace: float = 30.0
    """Seconds an fd-holder process keeps the FUSE connection alive for a successor after the
    daemon dies (mount/holder.py); 0: no holder."""
    fuse_priority: str = "rr"
    """CPU priority of the thread serving FUSE: rr | nice | normal (mount/priority.py)."""

    @property
    def control_socket(self) -> Path:
        return self.control or self.state_dir / "control.sock"


@dataclass
class LoadedLayer:
    repo: str
    digest: str
    index: LayerIndex
    remote: RemoteLayer
    blob_size: int
    info: dict[str, Any]


@dataclass
class OpenFile:
    layer: LoadedLayer
    ino: int
    entry: TocEntry
    env: Env | None
    next_off: int = 0
    ahead_until: int = -1  # highest chunk index readahead was issued for
    chunk_offsets: list[int] | None = None


def _hex(digest: str) -> str:
    algo, _, hexd = digest.partition(":")
    if algo != "sha256" or len(hexd) != 64:
        raise InvalidRequest(f"not a sha256 digest: {digest!r}")
    return hexd


def layer_ref(ref: Any) -> tuple[str, str]:
    """(repo, digest) from a dict or an object with .repo/.digest (e.g. plan.LayerRef)."""
    if isinstance(ref, dict):
        repo, digest = ref.get("repo"), ref.get("digest")
    else:
        repo, digest = getattr(ref, "repo", None), getattr(ref, "digest", None)
    if not isinstance(repo, str) or not isinstance(digest, str):
        raise InvalidRequest(f"a layer reference needs 'repo' and 'digest': {ref!r}")
    _hex(digest)
    return repo, digest


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
        self.tocs = TocCache(config.state_dir / "tocs")
        self.traces = TraceStore(config.state_dir / "traces")
        self.envs = EnvTable()
        self.layers: dict[str, LoadedLayer] = {}
        self._bases: list[int] = []
        self._base_layers: list[LoadedLayer] = []
        self._next_base = FIRST_LAYER_INODE
        self._kept_bases: dict[str, int] = {}  # layer hex -> inode base to reuse (takeover)
        self._loading: dict[str, trio.Event] = {}
        self.files: dict[int, OpenFile] = {}
        self._next_fh = 1
        self._unopened: dict[int, OpenFile] = {}  # no-open mode: read state per inode, LRU
        self._dirs_prefetched: set[tuple[str, str]] = set()  # (layer digest, directory path)
        self.started = time.time()
        self.layers_changed_ns = int(self.started * 1e9)  # mtime of /layers (kernel listing caches)
        self.fs_ops: dict[str, int] = {}  # filled in by the FUSE layer
        self.fs_mode: dict[str, Any] = {}  # filled in by the FUSE layer and the daemon
        # set by the FUSE layer on a pyfuse3 with the xattr fast path (patch level 3):
        # called with the inode ranges that have no xattrs and the exceptions inside them
        self.xattr_hook: Callable[[list[tuple[int, int]], frozenset[int]], None] | None = None
        self.fs_fast_stats: Callable[[], dict[str, int]] | None = None
        self.shared = {"hits": 0, "misses": 0, "errors": 0, "published": 0, "publish_errors": 0}

    # -- layers ----------------------------------------------------------------------------
    async def add_layers(self, refs: Iterable[Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        pairs = [layer_ref(r) for r in refs]
        results: dict[str, dict[str, Any]] = {}
        async with trio.open_nursery() as n:
            for repo, digest in pairs:
                n.start_soon(self._add_one, repo, digest, results)
        out = [results[d] for _, d in pairs]
        return {"layers": out, "seconds": round(time.perf_counter() - t0, 6),
                "bytes": sum(r["toc_bytes"] for r in out), "requests": sum(r["toc_requests"] for r in out)}

    async def _add_one(self, repo: str, digest: str, results: dict[str, dict[str, Any]]) -> None:
        hexd = _hex(digest)
        while hexd in self._loading:
            await self._loading[hexd].wait()
        if hexd in self.layers:
            results[digest] = dict(self.layers[hexd].info, loaded=True, toc_requests=0, toc_bytes=0, toc_seconds=0.0)
            return
        done = self._loading[hexd] = trio.Event()
        try:
            t0 = time.perf_counter()
            store = self.store
            opened = await trio.to_thread.run_sync(
                self.tocs.open, digest, lambda: store.blob_size(repo, digest),
                lambda off, n: store.read_blob(repo, digest, off, n))
            base = self._kept_bases.get(hexd, self._next_base)
            index = LayerIndex(digest, opened.toc, base)
            self._next_base = max(self._next_base, base + index.size + 16)
            toc = opened.toc
            remote = RemoteLayer(repo, digest, lambda off, n: store.read_blob(repo, digest, off, n),
                                 lambda: (c for e in toc for c in e.chunks),
                                 read_ranges=lambda spans: byteranges.read_ranges(store, repo, digest, spans),
                                 multi_range=lambda: byteranges.can_read_ranges(store))
            info = {"repo": repo, "digest": digest, "entries": len(toc), "blob_size": opened.blob_size,
                    "toc_cached": opened.cached, "toc_requests": opened.requests, "toc_bytes": opened.bytes,
                    "toc_seconds": round(time.perf_counter() - t0, 6), "loaded": False,
                    "dir": str(self.layer_dir(digest))}
            layer = LoadedLayer(repo, digest, index, remote, opened.blob_size, info)
            self.layers[hexd] = layer
            self.layers_changed_ns = time.time_ns()
            i = bisect.bisect(self._bases, base)
            self._bases.insert(i, base)
            self._base_layers.insert(i, layer)
            self._record_layers()
            results[digest] = info
            self.publish_xattr_ranges()  # xattr-free inodes from the TOC's records: ~1 ms
            if len(toc) <= SMALL_LAYER:
                index.hardlinks()  # a few ms: exact link counts from the first getattr on
            else:
                self.fetcher.spawn(self._prepare, layer)
        finally:
            del self._loading[hexd]
            done.set()

    # -- inode continuity across a daemon takeover (mount/holder.py) ------------------------
    @property
    def _layers_file(self) -> Path:
        return self.config.state_dir / "layers.json"

    def _record_layers(self) -> None:
        """The loaded layers and their inode bases: the kernel knows the inodes, so a daemon
        that takes the connection over must serve the same numbers."""
        doc = [{"repo": la.repo, "digest": la.digest, "base": la.index.base} for la in self._base_layers]
        tmp = self._layers_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self._layers_file)

    def forget_recorded_layers(self) -> None:
        """A fresh mount: inode numbers start over."""
        self._layers_file.unlink(missing_ok=True)

    async def restore_layers(self) -> dict[str, Any]:
        """Load the layers a previous daemon served on this connection, at the same inode
        bases (TOCs come from the TOC cache on disk)."""
        try:
            doc = json.loads(self._layers_file.read_text())
            kept = {_hex(d["digest"]): (d["repo"], d["digest"], int(d["base"])) for d in doc}
        except FileNotFoundError:
            return {"layers": [], "seconds": 0.0, "bytes": 0, "requests": 0}
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidRequest(f"{self._layers_file}: unreadable layer record ({exc})") from None
        self._kept_bases = {h: base for h, (_, _, base) in kept.items()}
        return await self.add_layers({"repo": r, "digest": d} for r, d, _ in kept.values())

    async def _prepare(self, layer: LoadedLayer) -> None:
        """Off the critical path: hardlink counts of a big layer (materialises every entry, ~0.1 s
        of CPU for 30k entries). Delayed so it does not compete for the GIL with the reads of the
        environment that is starting right now."""
        await trio.sleep(PREPARE_DELAY)
        await trio.to_thread.run_sync(layer.index.hardlinks)

    def _fuse_ops(self) -> dict[str, int]:
        """FUSE requests served, by operation; `getxattr_fast`: xattr requests answered by the
        patched pyfuse3 in C (not counted under `getxattr`)."""
        ops = dict(self.fs_ops)
        if self.fs_fast_stats is not None:
            fast = self.fs_fast_stats()
            ops["getxattr_fast"] = int(fast["xattr_fast_replies"])
        return ops

    def publish_xattr_ranges(self) -> None:
        """Tell the FUSE layer which inodes have no xattrs (every scanned layer's range, minus its
        inodes with xattrs), so overlayfs' `trusted.overlay.*` probes are answered without Python."""
        if self.xattr_hook is None:
            return
        ranges: list[tuple[int, int]] = []
        inodes: set[int] = set()
        for layer in self._base_layers:
            ranges.append((layer.index.base, layer.index.base + layer.index.size))
            inodes |= layer.index.xattr_inodes
        self.xattr_hook(ranges, frozenset(inodes))

    def layer_dir(self, digest: str) -> Path:
        return self.config.mountpoint / "layers" / _hex(digest)

    def layer_of(self, ino: int) -> LoadedLayer | None:
        i = bisect.bisect_right(self._bases, ino) - 1
        if i < 0:
            return None
        layer = self._base_layers[i]
        return layer if layer.index.owns(ino) else None

    def _loaded(self, digest: str) -> LoadedLayer:
        layer = self.layers.get(_hex(digest))
        if layer is None:
            raise NotFound(f"layer {digest} is not loaded (add it first)")
        return layer

    # -- reads -----------------------------------------------------------------------------
    def open_file(self, ino: int, pid: int) -> int:
        layer = self.layer_of(ino)
        if layer is None:
            raise NotFound(f"inode {ino}")
        fh = self._next_fh
        self._next_fh += 1
        entry = layer.index.entry(ino)
        of = self.files[fh] = OpenFile(layer, ino, entry, self.envs.for_pid(pid))
        if self.config.fetch.fetch_on_open and entry.chunks:
            # the first read is coming: start its miss now (a no-op if cached or in flight)
            c = entry.chunks[0]
            if c.digest not in self.memory:
                index = layer.index
                same_dir = self.config.fetch.neighbor_same_dir
                self.fetcher.start(layer.remote, c, of.env.account if of.env is not None else None,
                                   index.chunks_after(ino, c.offset, same_dir), index.chunks_before(ino, same_dir))
        return fh

    def release(self, fh: int) -> None:
        self.files.pop(fh, None)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        of = self.files[fh]
        return await self._read(of, of.env, off, size)

    async def read_unopened(self, ino: int, off: int, size: int, pid: int) -> bytes:
        """A read in no-open mode: the kernel sent no OPEN, so the read state is kept per inode
        (the most recent UNOPENED_STATES of them) and the environment is the reader's."""
        of = self._unopened.pop(ino, None)
        if of is None:
            layer = self.layer_of(ino)
            if layer is None:
                raise NotFound(f"inode {ino}")
            entry = layer.index.entry(ino)
            if entry.type is not EntryType.REG:
                raise InvalidRequest(f"inode {ino} is not a regular file")
            of = OpenFile(layer, ino, entry, None)
            if len(self._unopened) >= UNOPENED_STATES:
                del self._unopened[next(iter(self._unopened))]
        self._unopened[ino] = of  # most recent last
        return await self._read(of, self.envs.for_pid(pid), off, size)

    async def _read(self, of: OpenFile, env: Env | None, off: int, size: int) -> bytes:
        e = of.entry
        if off >= e.size or size <= 0:
            return b""
        end = min(e.size, off + size)
        if len(e.chunks) > 1:
            if of.chunk_offsets is None:
                of.chunk_offsets = [c.offset for c in e.chunks]
            lo = bisect.bisect_right(of.chunk_offsets, off) - 1
            chunks = e.chunks[max(lo, 0):bisect.bisect_left(of.chunk_offsets, end)]
        else:
            chunks = e.chunks
        acct = env.account if env is not None else None
        used = [min(end, c.offset + c.size) - max(off, c.offset) for c in chunks]
        index = of.layer.index
        same_dir = self.config.fetch.neighbor_same_dir
        after = index.chunks_after(of.ino, chunks[-1].offset, same_dir)
        before = index.chunks_before(of.ino, same_dir) if chunks[0].offset == 0 else None
        if self.config.fetch.dir_prefetch_bytes and self.fetcher.would_fetch(chunks[0]):
            self._dir_prefetch(of, acct)
        datas = await self.fetcher.get_many(of.layer.remote, chunks, acct, used, after, before)
        if env is not None and env.recorder is not None:
            for c in chunks:
                env.recorder.record(of.layer.digest, _chunk_doc(c))
        if len(e.chunks) > 1:
            self._readahead(of, off, chunks[-1], acct)
        of.next_off = max(of.next_off, end)
        if len(chunks) == 1:
            c = chunks[0]
            return datas[0][off - c.offset:end - c.offset]
        parts = []
        for c, data in zip(chunks, datas):
            parts.append(data[max(off, c.offset) - c.offset:min(end, c.offset + c.size) - c.offset])
        return b"".join(parts)

    def _dir_prefetch(self, of: OpenFile, acct: Any) -> None:
        """A registry miss in a directory not prefetched before: fetch the directory's other
        small files in parallel, beside the demand request (which claims its chunks first: the
        prefetch task starts at the next checkpoint). Once per (layer, directory) per daemon."""
        cfg = self.config.fetch
        key = (of.layer.digest, of.entry.path.rpartition("/")[0])
        if key in self._dirs_prefetched:
            return
        self._dirs_prefetched.add(key)
        siblings = of.layer.index.sibling_chunks(of.ino, cfg.dir_prefetch_file_max)
        picked, stored = [], 0
        for c in siblings:
            if stored + c.blob_size > cfg.dir_prefetch_bytes:
                break
            picked.append(c)
            stored += c.blob_size
        if picked:
            self.fetcher.spawn(self.fetcher.prefetch, of.layer.remote, picked, acct, Priority.PREFETCH, False,
                               cfg.dir_prefetch_request)

    def _readahead(self, of: OpenFile, off: int, last: Chunk, acct: Any) -> None:
        """Sequential reader of a multi-chunk file: keep the next `readahead_bytes` of it in
        flight (a sliding window, topped up as the reader advances). The kernel issues reads
        concurrently and slightly out of order, so "sequential" tolerates 1 MiB of jitter."""
        if off != 0 and abs(off - of.next_off) > (1 << 20):
            return
        chunks = of.entry.chunks
        if of.chunk_offsets is None:
            of.chunk_offsets = [c.offset for c in chunks]
        k = bisect.bisect_left(of.chunk_offsets, last.offset)
        start = max(k + 1, of.ahead_until + 1)
        budget = self.config.fetch.readahead_bytes
        stored = sum(c.blob_size for c in chunks[k + 1:start])
        ahead = []
        for c in chunks[start:]:
            if stored + c.blob_size > budget and (ahead or stored):
                break
            ahead.append(c)
            stored += c.blob_size
        batch = sum(c.blob_size for c in ahead)
        # top the window up in requests of >= READAHEAD_BATCH (fewer, bigger GETs), except at
        # the start of a read and at the end of the file
        if ahead and batch < READAHEAD_BATCH and start > k + 1 and start + len(ahead) < len(chunks):
            return
        if ahead:
            of.ahead_until = start + len(ahead) - 1
            self.fetcher.spawn(self.fetcher.prefetch, of.layer.remote, ahead, acct, Priority.PREFETCH, True)

    async def chunk_bytes(self, digest: str, wait: float = 0.0, any_stage: bool = True) -> bytes | None:
        """A chunk we hold (memory or disk), for peers. With `wait`, a chunk we are fetching right
        now is waited for (up to `wait` s): a peer that starts on the same chunk a moment later
        gets it from us instead of pulling it from the registry too. `any_stage=False`: only a
        fetch already at the registry stage is waited for (it waits on no peer: no wait cycle)."""
        flight = self.fetcher._inflight.get(digest) if wait > 0 else None  # noqa: SLF001
        if flight is not None and (any_stage or flight.at_registry):
            with trio.move_on_after(min(wait, 10.0)):  # bounded: a stuck fetch must not hold peers
                await flight.event.wait()
        data = self.memory.get(digest)
        if data is None:
            data = self.fetcher.unwritten(digest)
        if data is None and digest in self.disk:
            data = await trio.to_thread.run_sync(self.disk.get, digest)
        return data

    # -- eager fetch -----------------------------------------------------------------------
    async def fetch_all(self, refs: Iterable[Any], background: bool = False) -> dict[str, Any]:
        """Every chunk of these layers made local: at prefetch priority, or `background`: as
        gated background fill (`ChunkFetcher.fill`, one layer after the other)."""
        t0 = time.perf_counter()
        added = await self.add_layers(refs)
        before = self.metrics.snapshot()["transferred_bytes"].get("registry", 0)
        if background:
            for doc in added["layers"]:
                await self.fetcher.fill(self._loaded(doc["digest"]).remote)
        else:
            async with trio.open_nursery() as n:
                for doc in added["layers"]:
                    n.start_soon(self._fetch_layer, self._loaded(doc["digest"]))
        after = self.metrics.snapshot()["transferred_bytes"].get("registry", 0)
        return {"seconds": round(time.perf_counter() - t0, 6), "fetched_bytes": after - before,
                "stack_bytes": sum(d["blob_size"] for d in added["layers"])}

    async def _fetch_layer(self, layer: LoadedLayer) -> None:
        await trio.to_thread.run_sync(layer.remote.build_index)
        await self.fetcher.prefetch(layer.remote, layer.remote.chunks or (), None, Priority.PREFETCH)

    # -- environments ----------------------------------------------------------------------
    async def begin_env(self, env_id: str, refs: Iterable[Any], trace_key: str | None = None,
                        background: bool = True, fallback_key: str | None = None) -> dict[str, Any]:
        """Register an environment on these layers. `trace_key` names its work (stack + task):
        the trace of that key (this node's, else one another node published) is prefetched at
        once; without one, `fallback_key`'s (the stack's: what any task's first seconds read) is,
        and this environment's own reads are recorded under `trace_key` (and merged into
        `fallback_key`'s) for the environments after it."""
        if not env_id or "/" in env_id:
            raise InvalidRequest(f"bad environment id {env_id!r}")
        added = await self.add_layers(refs)
        old = self.envs.envs.pop(env_id, None)
        if old is not None:
            old.cancel.cancel()
        env = Env(env_id, [d["digest"] for d in added["layers"]], trace_key, fallback_key=fallback_key)
        self.envs.envs[env_id] = env
        self.envs.forget_pids()
        fc = self.config.fetch
        source = None
        if trace_key:
            trace, source = await self._find_trace(trace_key, added["layers"])
            if not trace and fallback_key:
                trace, found = await self._find_trace(fallback_key, added["layers"])
                source = f"stack-{found}" if found else None
            if trace:
                env.prefetch_chunks = len(trace)
                self.fetcher.spawn(self._run_in_env, env, self._trace_prefetch, env, trace)
            if source is None or source.startswith("stack-"):  # no trace of this task yet: record one
                env.recorder = TraceRecorder(trace_key, fc.trace_window, fc.trace_max_chunks)
                self.fetcher.spawn(self._save_trace_later, env)
        if background:
            self.fetcher.spawn(self._run_in_env, env, self._background_fill, env)
        return {"env_id": env_id, "layers": added, "trace_prefetch_chunks": env.prefetch_chunks,
                "trace_source": source}

    async def _find_trace(self, key: str, layers: list[dict[str, Any]]) -> tuple[list[tuple[str, dict]], str | None]:
        """(trace, "local" | "shared" | None): this node's trace of `key`, else a published one."""
        trace = self.traces.load(key)
        if trace:
            return trace, "local"
        if self.config.share_traces:
            trace = await self._shared_trace(key, layers)
            if trace:
                self.traces.put(key, trace, self.config.fetch.trace_max_chunks)
                return trace, "shared"
        return [], None

    async def _shared_trace(self, key: str, layers: list[dict[str, Any]]) -> list[tuple[str, dict]]:
        """The trace another node published for `key`, validated against this stack; [] when
        there is none, it is invalid or the store does not answer within SHARED_TRACE_TIMEOUT."""
        sizes = {d["digest"]: int(d["blob_size"]) for d in layers}
        store = self.store
        trace: list[tuple[str, dict]] | None = None
        try:
            with trio.move_on_after(SHARED_TRACE_TIMEOUT) as scope:
                trace = await trio.to_thread.run_sync(shared_traces.lookup, store, key, sizes,
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
        return trace

    async def _run_in_env(self, env: Env, fn: Any, *args: Any) -> None:
        with env.cancel:
            await fn(*args)

    async def _trace_prefetch(self, env: Env, trace: list[tuple[str, dict]]) -> None:
        """Fetch a trace in growing waves (`fetch.waves`), in first-read order: every wave is
        claimed at once (reads join its flights) and the prefetch limiter (FIFO) issues the
        waves' requests roughly in the order the previous environment needed them."""
        known = [(digest, doc) for digest, doc in trace if digest.partition(":")[2] in self.layers]
        waves = [(self.layers[digest.partition(":")[2]], [_chunk_from_doc(known[i][1]) for i in idx])
                 for digest, idx in plan_waves((d, int(doc["bs"])) for d, doc in known)]
        async with trio.open_nursery() as n:
            for layer, chunks in waves:
                n.start_soon(self.fetcher.prefetch, layer.remote, chunks, env.account, Priority.PREFETCH)

    async def _background_fill(self, env: Env) -> None:
        """The rest of the environment's layers, after a grace period (its first command runs
        on an uncontended node); each request is admitted by the fetcher's background gate."""
        await trio.sleep(self.config.fetch.background_grace)
        for digest in env.layers:
            layer = self.layers.get(_hex(digest))
            if layer is not None:
                await self.fetcher.fill(layer.remote, env.account)

    async def _save_trace_later(self, env: Env) -> None:
        await trio.sleep(self.config.fetch.trace_window)
        self._save_trace(env)

    def _save_trace(self, env: Env) -> None:
        rec = env.recorder
        if rec is not None and rec.chunks:
            self.traces.save(rec)
            env.recorder = None
            saved = {rec.key: self.traces.load(rec.key)}
            if env.fallback_key:
                self.traces.put(env.fallback_key, saved[rec.key], self.config.fetch.trace_max_chunks)
                saved[env.fallback_key] = self.traces.load(env.fallback_key)  # merged with earlier tasks'
            if self.config.share_traces:
                for key, entries in saved.items():
                    threading.Thread(target=self._publish_trace, args=(key, entries), daemon=True,
                                     name="publish-trace").start()

    def _publish_trace(self, key: str, entries: list[tuple[str, dict]]) -> None:
        """Worker thread, best effort: a store that refuses or fails only loses the sharing."""
        try:
            shared_traces.publish(self.store, key, entries)
            self.shared["published"] += 1
        except Exception as exc:  # noqa: BLE001
            self.shared["publish_errors"] += 1
            log.warning("could not publish the trace of %r: %s", key, exc)

    def end_env(self, env_id: str) -> dict[str, Any]:
        env = self.envs.envs.pop(env_id, None)
        if env is None:
            raise NotFound(f"environment {env_id} is not known to the lazy store")
        env.cancel.cancel()
        self._save_trace(env)
        return env.stats()

    def env_stats(self, env_id: str) -> dict[str, Any]:
        env = self.envs.envs.get(env_id)
        if env is None:
            raise NotFound(f"environment {env_id} is not known to the lazy store")
        return env.stats()

    def stats(self) -> dict[str, Any]:
        return {
            "layers": len(self.layers),
            "environments": len(self.envs.envs),
            "open_files": len(self.files),
            "unopened_read_states": len(self._unopened),
            "memory_cache": {"bytes": self.memory.bytes, "budget": self.memory.budget, "chunks": len(self.memory)},
            "disk_cache": {"bytes": self.disk.bytes, "budget": self.disk.budget, "chunks": len(self.disk),
                           "evictions": self.disk.evictions, "rejected": self.disk.rejected,
                           **self.fetcher.writeback_queue()},
            "peers": {"urls": list(self.peers.urls if self.peers else self.config.peers),
                      "hits": self.peers.hits if self.peers else 0, "misses": self.peers.misses if self.peers else 0},
            "fetch": self.metrics.snapshot(),
            "background": self.fetcher.gate.snapshot(),
            "fuse_ops": self._fuse_ops(),
            "fuse_mode": dict(self.fs_mode),
            "shared_trace_hits": self.shared["hits"], "shared_trace_misses": self.shared["misses"],
            "shared_trace_errors": self.shared["errors"], "shared_traces_published": self.shared["published"],
            "shared_trace_publish_errors": self.shared["publish_errors"],
            "uptime_seconds": round(time.time() - self.started, 3),
        }

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

    def drop_caches(self) -> None:
        self.fetcher.drop_queued()
        self.memory.clear()
        self.disk.clear()

    def update_metric_gauges(self) -> None:
        self.metrics.cache_bytes.labels("memory").set(self.memory.bytes)
        self.metrics.cache_bytes.labels("disk").set(self.disk.bytes)


def _chunk_doc(c: Chunk) -> dict[str, Any]:
    return {"o": c.offset, "s": c.size, "bo": c.blob_offset, "bs": c.blob_size, "d": c.digest,
            "c": c.compression.value}


def _chunk_from_doc(doc: dict[str, Any]) -> Chunk:
    return Chunk(offset=int(doc["o"]), size=int(doc["s"]), blob_offset=int(doc["bo"]), blob_size=int(doc["bs"]),
                 digest=str(doc["d"]), compression=Compression(doc["c"]))

