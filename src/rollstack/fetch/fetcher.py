"""`ChunkFetcher`: gets verified chunk bytes through memory -> disk -> peers -> registry.

Runs on trio (inside the FUSE daemon); every blocking step (store range reads, decompression
and hashing, disk cache I/O, peer HTTP) runs in a worker thread.

- Single-flight: a chunk being fetched has one `_Flight`; every concurrent reader of that chunk
  (any layer: flights are keyed by content digest) waits on it, so it is fetched once.
- Coalescing: the chunks one fetch needs are planned into range GETs (`coalesce`), at most
  `max_request` bytes each, issued in parallel (bounded per priority). Prefetch packs several
  ranges into one GET where the store answers multi-range requests (`store.byteranges`,
  `coalesce.pack`): a trace's scattered chunks in a few requests, with no gap bytes.
- Neighbours: a demand miss also claims the next chunks of the blob (up to `neighbor_bytes`):
  in this format they are the next files of the same directory, which the same program tends
  to read next; one round trip instead of several.
- Priorities: demand reads, prefetch and background fill each have their own concurrency
  limiter. Background fill is gated (`BackgroundGate`): a request starts only while no demand
  or prefetch request is in flight and none ended in the last `background_quiet` seconds, and
  within a token bucket of `background_share` x `link_rate`; one request at a time, 1 MiB each.
  Background chunks are read, verified and written to the disk cache in one worker-thread call
  (nothing per chunk on the trio thread that serves FUSE) and skip the memory cache (fill must
  not evict what running programs use).
- Integrity: every chunk is decoded with `decode_chunk` (verifies the digest) before it is
  cached or served. A mismatch refetches that chunk once; a second mismatch fails its readers
  with IntegrityError and records an `integrity_error` event. Bad bytes are never cached.
- Failure: registry errors are retried with exponential backoff until `deadline` seconds after
  the fetch began; then its readers fail (RegistryUnavailable), nothing is cached, and the next
  read tries again.
- Write-back: fetched chunks reach the disk cache once the foreground is quiet, in one worker
  call per batch at idle CPU priority.

Why one module of ~650 lines: everything here reads and writes one state (the flight table, the
per-priority limiters, the write-back queue) on one trio thread; the tier steps are methods
because each must claim, land or fail flights of that table. The pure parts are elsewhere
(`coalesce`, `waves`, `background`, `stats`).
"""

from __future__ import annotations

import contextlib
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Iterable, Sequence

import trio

from rollstack.errors import FormatError, IntegrityError, NotFound, RegistryUnavailable, RollstackError
from rollstack.fetch.background import BackgroundGate, idle_thread
from rollstack.fetch.coalesce import following, pack, window, window_back
from rollstack.fetch.config import FetchConfig
from rollstack.fetch.disk import DiskChunkCache
from rollstack.fetch.layer import RemoteLayer
from rollstack.fetch.memory import MemoryChunkCache
from rollstack.fetch.peers import PeerClient
from rollstack.fetch.stats import Account, FetchMetrics, Priority, Tier
from rollstack.format.ranges import RangeRequest, coalesce
from rollstack.format.toc import Chunk, Compression

Decoder = Callable[[Chunk, bytes], bytes]
WRITEBACK_BATCH = 16 << 20  # bytes of chunks per write-back worker call
log = logging.getLogger("rollstack.fetch")


def _default_decoder() -> Decoder:
    from rollstack.format import decode_chunk

    return decode_chunk


class _Flight:
    __slots__ = ("event", "urgent", "data", "tier", "error", "at_registry")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.at_registry = False  # past memory/disk/peers: being pulled from the registry (waits on no one)
        self.urgent = False  # a read is blocked on it: decode and hand it over first
        self.data: bytes | None = None
        self.tier = Tier.REGISTRY
        self.error: BaseException | None = None

    def done(self, data: bytes | None, tier: Tier, error: BaseException | None = None) -> None:
        if self.event.is_set():
            return
        self.data, self.tier, self.error = data, tier, error
        self.event.set()


class ChunkFetcher:
    def __init__(self, config: FetchConfig, memory: MemoryChunkCache, disk: DiskChunkCache | None = None,
                 peers: PeerClient | None = None, metrics: FetchMetrics | None = None,
                 decode: Decoder | None = None) -> None:
        self.config = config
        self.memory = memory
        self.disk = disk
        self.peers = peers if peers is not None and peers.urls else None
        self.metrics = metrics or FetchMetrics()
        self._decode = decode or _default_decoder()
        self._inflight: dict[str, _Flight] = {}
        self._limiters = {
            Priority.FOREGROUND: trio.CapacityLimiter(config.foreground_requests),
            Priority.PREFETCH: trio.CapacityLimiter(max(1, config.prefetch_requests)),
            Priority.BACKGROUND: trio.CapacityLimiter(config.background_requests),
        }
        self._threads = trio.CapacityLimiter(32)
        self.gate = BackgroundGate(config.link_rate * config.background_share, config.background_quiet,
                                   burst=max(config.background_request, 1 << 20),
                                   min_idle=config.background_min_idle)
        self._nursery: trio.Nursery | None = None
        self._writes: trio.Nursery | None = None
        self._unwritten: dict[str, bytes] = {}  # fetched, verified, not yet in the disk cache
        self._unwritten_bytes = 0
        self._writeback_generation = 0  # bumped by drop_queued: a batch being written stops
        self._writeback_wake = trio.Event()
        self._writeback_wait: trio.CancelScope | None = None
        self._closing = False
        self.activity: Callable[[], int] | None = None
        """Demand activity besides fetches (the FUSE layer sets its request count): write-back
        waits for it to go quiet too."""

    # -- lifecycle -------------------------------------------------------------------------
    @asynccontextmanager
    async def running(self) -> AsyncIterator["ChunkFetcher"]:
        """Owns the tasks the fetcher spawns (disk writes, prefetch, background fill)."""
        async with trio.open_nursery() as writes:  # disk writes finish on exit, never cancelled
            self._writes = writes
            self._closing = False
            writes.start_soon(self._writeback)
            try:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    try:
                        yield self
                    finally:
                        self._nursery = None
                        nursery.cancel_scope.cancel()
            finally:
                self._closing = True  # the write-back task flushes what waits, then ends
                self._writeback_wake.set()
                if self._writeback_wait is not None:
                    self._writeback_wait.cancel()
        self._writes = None

    def spawn(self, fn: Callable, *args: object) -> None:
        """Run `fn(*args)` in the background; its failure is logged and counted, never fatal."""
        if self._nursery is not None:
            self._nursery.start_soon(self._guarded, fn, args)

    async def _guarded(self, fn: Callable, args: tuple) -> None:
        try:
            await fn(*args)
        except Exception as exc:  # noqa: BLE001 - a background task must not take the daemon down
            log.warning("background task %s failed: %r", getattr(fn, "__name__", fn), exc)
            self.metrics.event("background_error", task=getattr(fn, "__name__", str(fn)), error=repr(exc)[:300])

    # -- demand reads ----------------------------------------------------------------------
    def cached(self, chunk: Chunk) -> bytes | None:
        return self.memory.get(chunk.digest)

    async def get(self, layer: RemoteLayer, chunk: Chunk, account: Account | None = None,
                  used: int | None = None, after: Iterable[Chunk] | None = None,
                  before: Iterable[Chunk] | None = None) -> bytes:
        """The verified, decompressed bytes of `chunk` (a read is blocked on it).

        `used`: how many of its bytes the read returns (what the account is charged; default
        all). `after`: the chunks stored after it in blob order (lazily produced), the pool a
        miss takes neighbours from; default: the layer's chunk index once it is built."""
        t0 = trio.current_time()
        data = self.memory.get(chunk.digest)
        if data is not None:
            self._served(Tier.MEMORY, chunk.size if used is None else used, 0.0, account)
            return data
        flight = self._inflight.get(chunk.digest)
        if flight is None:
            claimed = self._claim([chunk, *self._neighbours(layer, chunk, after, before)])
            flight = claimed[0][1]
            self._resolve_soon(layer, claimed, account)  # starts at the next checkpoint
        flight.urgent = True
        await flight.event.wait()
        if flight.error is not None:
            raise _fresh(flight.error)
        assert flight.data is not None
        self._served(flight.tier, chunk.size if used is None else used, trio.current_time() - t0, account)
        return flight.data

    def start(self, layer: RemoteLayer, chunk: Chunk, account: Account | None = None,
              after: Iterable[Chunk] | None = None, before: Iterable[Chunk] | None = None) -> bool:
        """Begin fetching `chunk` (and its neighbours) now, as a demand miss, without waiting:
        called at open(), so the network round trip overlaps the requests the kernel makes
        between open and the first read. The read then joins the flight. False: nothing to do."""
        d = chunk.digest
        if self._nursery is None or d in self.memory or d in self._inflight:
            return False
        claimed = self._claim([chunk, *self._neighbours(layer, chunk, after, before)])
        claimed[0][1].urgent = True
        self._resolve_soon(layer, claimed, account)
        return True

    def _resolve_soon(self, layer: RemoteLayer, claimed: list[tuple[Chunk, _Flight]],
                      account: Account | None) -> None:
        """Resolve a demand miss in its own task: each reader waits on its chunk's flight only,
        so it is served as soon as that chunk is verified, not when the whole range is."""
        if self._nursery is None:
            raise RuntimeError("ChunkFetcher used outside `running()`")
        self._nursery.start_soon(self._resolve_quietly, layer, claimed, account)

    async def _resolve_quietly(self, layer: RemoteLayer, claimed: list[tuple[Chunk, _Flight]],
                               account: Account | None) -> None:
        # failures reach the reader through the flights; nothing to raise here
        await self._resolve(layer, claimed, Priority.FOREGROUND, account, keep_going=True)

    async def get_many(self, layer: RemoteLayer, chunks: Sequence[Chunk], account: Account | None = None,
                       used: Sequence[int] | None = None, after: Iterable[Chunk] | None = None,
                       before: Iterable[Chunk] | None = None) -> list[bytes]:
        """The chunks of one read, in order; what is missing is fetched in one coalesced plan
        (plus neighbours after the last one)."""
        u: Sequence[int | None] = used if used is not None else [None] * len(chunks)
        if len(chunks) == 1:
            return [await self.get(layer, chunks[0], account, u[0], after, before)]
        missing = [c for c in chunks if c.digest not in self.memory and c.digest not in self._inflight]
        if missing:
            claimed = self._claim([*missing, *self._neighbours(layer, chunks[-1], after, before)])
            for _, f in claimed[:len(missing)]:
                f.urgent = True
            self._resolve_soon(layer, claimed, account)
        return [await self.get(layer, c, account, k) for c, k in zip(chunks, u)]

    def _served(self, tier: Tier, nbytes: int, seconds: float, account: Account | None) -> None:
        self.metrics.served(tier, nbytes, seconds)
        if account is not None:
            account.record_read(tier, nbytes, seconds)

    def _neighbours(self, layer: RemoteLayer, chunk: Chunk, after: Iterable[Chunk] | None,
                    before: Iterable[Chunk] | None = None) -> list[Chunk]:
        budget = self.config.neighbor_bytes
        if not budget:
            return []
        if after is not None:
            out = window(after, chunk, budget, self._wanted)
            back = self.config.neighbor_back_bytes
            if back and before is not None:
                out += window_back(before, chunk, back, self._wanted)
            return out
        if layer.chunks is None or layer.offsets is None:
            return []
        return following(layer.chunks, layer.offsets, chunk, budget, self._wanted)

    def would_fetch(self, c: Chunk) -> bool:
        """True when reading `c` now would go past the node's caches (nothing local or in flight)."""
        return self._wanted(c)

    def _wanted(self, c: Chunk) -> bool:
        d = c.digest
        return (d not in self.memory and d not in self._inflight and d not in self._unwritten
                and (self.disk is None or d not in self.disk))

    def drop_queued(self) -> None:
        """Forget the chunks waiting for the disk cache (and stop a batch being written): with
        `drop_caches`, the node forgets every chunk it fetched."""
        self._writeback_generation += 1
        self._unwritten.clear()
        self._unwritten_bytes = 0

    def writeback_queue(self) -> dict[str, int]:
        """Fetched chunks still waiting for the disk cache."""
        return {"writeback_chunks": len(self._unwritten), "writeback_bytes": self._unwritten_bytes}

    def unwritten(self, digest: str) -> bytes | None:
        """A fetched chunk still waiting for the disk cache (see `_writeback`)."""
        return self._unwritten.get(digest)

    def _claim(self, chunks: Iterable[Chunk]) -> list[tuple[Chunk, _Flight]]:
        out = []
        for c in chunks:
            if c.digest in self._inflight:
                continue
            f = self._inflight[c.digest] = _Flight()
            out.append((c, f))
        self.metrics.inflight.set(len(self._inflight))
        return out

    # -- prefetch and background fill -------------------------------------------------------
    async def prefetch(self, layer: RemoteLayer, chunks: Iterable[Chunk], account: Account | None = None,
                       priority: Priority = Priority.PREFETCH, into_memory: bool = False,
                       max_request: int | None = None) -> None:
        """Fetch whatever of `chunks` is not local yet, in parallel; errors are only counted.
        `into_memory`: also load chunks the disk cache holds (readahead of a file being read).
        `max_request`: cap on one range GET (default `config.max_request`)."""
        if into_memory:
            wanted = [c for c in chunks if c.digest not in self.memory and c.digest not in self._inflight]
        else:
            wanted = [c for c in chunks if self._wanted(c)]
        claimed = self._claim(wanted)
        if claimed:
            await self._resolve(layer, claimed, priority, account, keep_going=True, max_request=max_request)

    async def fill(self, layer: RemoteLayer, account: Account | None = None) -> None:
        """Background fill: fetch every chunk of `layer` not yet cached, at low priority (each
        request admitted by `self.gate`). The plan (a walk over every chunk) is made in a worker
        thread: on a 30k-file layer it would hold the FUSE loop for tens of ms."""
        def plan() -> list[RangeRequest]:
            layer.build_index()
            todo = [c for c in layer.chunks or () if self._wanted(c)]
            return coalesce(todo, max_request=self.config.background_request)

        requests = await trio.to_thread.run_sync(plan, limiter=self._threads)
        slots = trio.Semaphore(self.config.background_requests)
        async with trio.open_nursery() as n:
            for req in requests:
                await slots.acquire()  # bounds how many of our requests exist at once
                await self.gate.admit(req.length)
                n.start_soon(self._fill_one, layer, req, account, slots)

    async def _fill_one(self, layer: RemoteLayer, req: RangeRequest, account: Account | None,
                        slots: trio.Semaphore) -> None:
        try:
            claimed = self._claim([c for c in req.chunks if self._wanted(c)])
            if claimed:
                await self._resolve(layer, claimed, Priority.BACKGROUND, account, keep_going=True)
        finally:
            slots.release()

    # -- the tiers -------------------------------------------------------------------------
    async def _resolve(self, layer: RemoteLayer, claimed: list[tuple[Chunk, _Flight]], priority: Priority,
                       account: Account | None, keep_going: bool = False, max_request: int | None = None) -> None:
        """Completes every claimed flight (with bytes or an error), whatever happens."""
        pending = {c.digest: (c, f) for c, f in claimed}
        try:
            if self.disk is not None:
                await self._from_disk(pending)
            if self.peers is not None and pending and len(pending) <= 64:
                await self._from_peers(layer, pending, priority, account)
            if pending:
                for _, f in pending.values():
                    f.at_registry = True
                await self._from_registry(layer, pending, priority, account, max_request)
        except BaseException as exc:  # noqa: BLE001 - flights must complete even on cancellation
            err = exc if isinstance(exc, RollstackError) else RegistryUnavailable(f"fetch failed: {exc!r}")
            for c, f in pending.values():
                f.done(None, Tier.REGISTRY, err)
            if not keep_going or not isinstance(exc, Exception):
                raise
        finally:
            for c, f in claimed:
                if not f.event.is_set():
                    f.done(None, Tier.REGISTRY, RegistryUnavailable("fetch abandoned"))
                if self._inflight.get(c.digest) is f:
                    del self._inflight[c.digest]
            self.metrics.inflight.set(len(self._inflight))

    def _complete(self, pending: dict, chunk: Chunk, data: bytes, tier: Tier) -> None:
        _, flight = pending.pop(chunk.digest)
        self.memory.put(chunk.digest, data)
        self._finish(chunk, flight, data, tier)

    def _finish(self, chunk: Chunk, flight: _Flight, data: bytes, tier: Tier) -> None:
        """A chunk is verified and cached: hand its bytes to the readers waiting on the flight
        and retire the flight now, not when the whole fetch ends. Only a flight a reader waits on
        (`urgent`, set before anyone awaits it) keeps the bytes: a whole-layer prefetch must not
        hold every chunk it fetched in memory until its last request lands."""
        flight.done(data if flight.urgent else None, tier)
        if self._inflight.get(chunk.digest) is flight:
            del self._inflight[chunk.digest]

    async def _from_disk(self, pending: dict[str, tuple[Chunk, _Flight]]) -> None:
        disk = self.disk
        assert disk is not None
        for c, _ in list(pending.values()):
            data = self._unwritten.get(c.digest)
            if data is not None:
                self._complete(pending, c, data, Tier.DISK)
        local = [c for c, _ in pending.values() if c.digest in disk]
        if not local:
            return
        found = await trio.to_thread.run_sync(lambda: [(c, disk.get(c.digest)) for c in local], limiter=self._threads)
        for c, data in found:
            if data is not None:
                self._complete(pending, c, data, Tier.DISK)

    async def _from_peers(self, layer: RemoteLayer, pending: dict, priority: Priority, account: Account | None) -> None:
        peers = self.peers
        assert peers is not None

        async def one(c: Chunk) -> None:
            got = await trio.to_thread.run_sync(peers.get, c.digest, limiter=self._threads)
            if got is None:
                return
            raw, url = got
            try:
                data = self._decode(_plain(c, len(raw)), raw)
            except FormatError:
                self.metrics.event("peer_integrity_error", peer=url, chunk=c.digest, layer=layer.digest)
                return
            self.metrics.transferred_bytes(Tier.PEER, priority, len(raw), [])
            if account is not None:
                account.record_transfer(Tier.PEER, priority, len(raw))
            if c.digest in pending:
                self._complete(pending, c, data, Tier.PEER)
                self._write_disk_many([(c, data)])

        async with trio.open_nursery() as n:
            for c, _ in list(pending.values()):
                n.start_soon(one, c)

    async def _from_registry(self, layer: RemoteLayer, pending: dict, priority: Priority,
                             account: Account | None, max_request: int | None = None) -> None:
        # prefetch: several ranges per GET where the store can (no gap bytes needed), else
        # one GET per run of chunks, bridging gaps of up to `prefetch_gap`
        multi = priority is Priority.PREFETCH and layer.read_ranges is not None and layer.multi_range()
        cfg = self.config
        gap = (cfg.multi_range_gap if multi else cfg.prefetch_gap) if priority is Priority.PREFETCH else 0
        limit = max_request or cfg.max_request
        plan = coalesce([c for c, _ in pending.values()], max_request=limit, max_gap=gap)
        batches = pack(plan, max_spans=cfg.multi_range_spans, max_bytes=limit) if multi \
            else [(req,) for req in plan]
        deadline = trio.current_time() + cfg.deadline
        limiter = self._limiters[priority]
        demand = priority is not Priority.BACKGROUND

        async def one(batch: tuple[RangeRequest, ...]) -> None:
            token = object()
            await limiter.acquire_on_behalf_of(token)
            if demand:
                self.gate.foreground_started()
            try:
                if len(batch) == 1:
                    await self._fetch_range(layer, batch[0], pending, priority, account, deadline)
                else:
                    await self._fetch_batch(layer, batch, pending, priority, account, deadline)
            except RollstackError as exc:
                for req in batch:
                    for c in req.chunks:
                        if c.digest in pending:
                            pending.pop(c.digest)[1].done(None, Tier.REGISTRY, exc)
            finally:
                if demand:
                    self.gate.foreground_finished()
                limiter.release_on_behalf_of(token)

        async with trio.open_nursery() as n:
            for batch in batches:
                n.start_soon(one, batch)

    async def _fetch_range(self, layer: RemoteLayer, req: RangeRequest, pending: dict, priority: Priority,
                           account: Account | None, deadline: float) -> None:
        """One range GET. The chunks a read is blocked on are decoded and handed over first; the
        rest of the range (neighbours) is decoded after, in a second worker-thread call."""
        # background fill, and anything fetched while the write-back queue is over its bound,
        # is written to the disk cache by the worker thread itself (back-pressure on the fetch)
        persist = self.disk is not None and (priority is Priority.BACKGROUND
                                             or self._unwritten_bytes >= self.config.writeback_max)
        chunks = list(req.chunks)
        urgent = {c.digest for c in chunks if c.digest in pending and pending[c.digest][1].urgent}
        first = [c for c in chunks if c.digest in urgent] if urgent and len(urgent) < len(chunks) else chunks
        good, bad, raw = await self._with_retries(layer, req.offset, req.length, first, deadline, persist,
                                                  idle=priority is Priority.BACKGROUND)
        self._transferred(layer, req.length, [c.digest for c in chunks], priority, account)
        await self._landed(layer, good, bad, pending, priority, account, deadline, persist)
        if first is not chunks:
            rest = [c for c in chunks if c.digest not in urgent and c.digest in pending]
            good, bad = await trio.to_thread.run_sync(self._decode_range, raw, req.offset, rest, persist,
                                                      limiter=self._threads)
            await self._landed(layer, good, bad, pending, priority, account, deadline, persist)

    async def _fetch_batch(self, layer: RemoteLayer, batch: tuple[RangeRequest, ...], pending: dict,
                           priority: Priority, account: Account | None, deadline: float) -> None:
        """Several ranges in one multi-range GET (prefetch), each decoded like a range of its own."""
        persist = self.disk is not None and self._unwritten_bytes >= self.config.writeback_max
        spans = [(r.offset, r.length) for r in batch]
        good, bad = await self._retrying(layer, f"{len(spans)} ranges from {spans[0][0]}", deadline,
                                         self._read_decode_many, layer, batch, persist)
        self._transferred(layer, sum(n for _, n in spans), [c.digest for r in batch for c in r.chunks], priority, account)
        await self._landed(layer, good, bad, pending, priority, account, deadline, persist)

    def _read_decode_many(self, layer: RemoteLayer, batch: tuple[RangeRequest, ...],
                          persist: bool) -> tuple[list[tuple[Chunk, bytes]], list[Chunk]]:
        """Worker thread: one multi-range GET, then `_decode_range` of every range."""
        assert layer.read_ranges is not None
        raws = layer.read_ranges([(r.offset, r.length) for r in batch])
        good: list[tuple[Chunk, bytes]] = []
        bad: list[Chunk] = []
        if len(raws) != len(batch):
            raise RegistryUnavailable(f"multi-range read of {layer.digest}: {len(raws)} answers for {len(batch)} ranges")
        for req, raw in zip(batch, raws):
            if len(raw) != req.length:
                raise RegistryUnavailable(f"short read from {layer.digest}: {len(raw)} of {req.length} bytes at {req.offset}")
            g, b = self._decode_range(raw, req.offset, list(req.chunks), persist)
            good += g
            bad += b
        return good, bad

    async def _landed(self, layer: RemoteLayer, good: list[tuple[Chunk, bytes]], bad: list[Chunk], pending: dict,
                      priority: Priority, account: Account | None, deadline: float, persist: bool) -> None:
        landed = [(c, data) for c, data in good if c.digest in pending]
        for c, data in landed:
            self._land(pending, c, data, persist)
        if not persist:
            self._write_disk_many(landed)  # one thread hop for the whole range, not one per chunk
        for c in bad:  # one refetch of that chunk alone, then give up on it
            again, still_bad, _ = await self._with_retries(layer, c.blob_offset, c.blob_size, [c], deadline, persist)
            self._transferred(layer, c.blob_size, [c.digest], priority, account)
            if again and c.digest in pending:
                self._land(pending, c, again[0][1], persist)
                if not persist:
                    self._write_disk_many(again)
            elif still_bad:
                self.metrics.event("integrity_error", layer=layer.digest, repo=layer.repo, chunk=c.digest,
                                   blob_offset=c.blob_offset)
                err = IntegrityError(f"chunk {c.digest} of layer {layer.digest} does not match its digest (twice)",
                                     layer=layer.digest, chunk=c.digest)
                if c.digest in pending:
                    pending.pop(c.digest)[1].done(None, Tier.REGISTRY, err)

    def _land(self, pending: dict, chunk: Chunk, data: bytes, persisted: bool) -> None:
        """A verified registry chunk: serve its waiters; cache it. Background chunks were already
        written to disk by the worker thread and skip the memory cache."""
        if persisted:
            _, flight = pending.pop(chunk.digest)
            self._finish(chunk, flight, data, Tier.REGISTRY)
            return
        self._complete(pending, chunk, data, Tier.REGISTRY)

    def _transferred(self, layer: RemoteLayer, nbytes: int, digests: list[str], priority: Priority,
                     account: Account | None) -> None:
        self.metrics.transferred_bytes(Tier.REGISTRY, priority, nbytes, digests)
        if account is not None:
            account.record_transfer(Tier.REGISTRY, priority, nbytes)

    async def _with_retries(self, layer: RemoteLayer, offset: int, length: int, chunks: list[Chunk],
                            deadline: float, persist: bool = False, idle: bool = False
                            ) -> tuple[list[tuple[Chunk, bytes]], list[Chunk], bytes]:
        """Read one range and decode `chunks` of it, retrying transient failures until `deadline`;
        (good, bad, the raw range)."""
        return await self._retrying(layer, f"[{offset}:+{length}]", deadline, self._read_decode, layer, offset,
                                    length, chunks, persist, idle)

    async def _retrying(self, layer: RemoteLayer, what: str, deadline: float, fn: Callable, *args: Any) -> Any:
        """`fn(*args)` in a worker thread, retried on transient failures until `deadline`."""
        delay = self.config.retry_initial
        attempt = 0
        while True:
            attempt += 1
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                raise RegistryUnavailable(f"registry did not deliver {layer.digest}{what} "
                                          f"within the {self.config.deadline:g}s deadline ({attempt - 1} attempts)",
                                          layer=layer.digest)
            try:
                with trio.fail_after(remaining):
                    return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True, limiter=self._threads)
            except trio.TooSlowError:
                continue  # loops into the deadline error above
            except (NotFound, FormatError):
                raise
            except Exception as exc:  # noqa: BLE001 - any transport failure is retryable
                self.metrics.event("registry_retry", layer=layer.digest, error=repr(exc)[:200], attempt=attempt)
                await trio.sleep(min(delay, max(0.0, deadline - trio.current_time())))
                delay = min(delay * 2, self.config.retry_max)

    def _read_decode(self, layer: RemoteLayer, offset: int, length: int, chunks: list[Chunk],
                     persist: bool = False, idle: bool = False) -> tuple[list[tuple[Chunk, bytes]], list[Chunk], bytes]:
        """Worker thread: one range GET, then `_decode_range` of `chunks` (`idle`: background
        fill, at idle CPU priority: `background.idle_thread`)."""
        with idle_thread() if idle else contextlib.nullcontext():
            raw = layer.read_range(offset, length)
            if len(raw) != length:
                raise RegistryUnavailable(f"short read from {layer.digest}: {len(raw)} of {length} bytes")
            return (*self._decode_range(raw, offset, chunks, persist), raw)

    def _decode_range(self, raw: bytes, offset: int, chunks: list[Chunk],
                      persist: bool = False) -> tuple[list[tuple[Chunk, bytes]], list[Chunk]]:
        """Worker thread: every chunk of `raw` (stored bytes from blob `offset`) verified;
        `persist`: also written to the disk cache here (background fill: no per-chunk work comes
        back to the trio thread)."""
        good, bad = [], []
        view = memoryview(raw)
        for c in chunks:
            start = c.blob_offset - offset
            try:
                good.append((c, self._decode(c, bytes(view[start:start + c.blob_size]))))
            except FormatError:
                bad.append(c)
        if persist and self.disk is not None:
            for c, data in good:
                try:
                    self.disk.put(c.digest, data)
                except OSError as exc:  # a full or failing disk: the chunk is still served
                    self.metrics.event("disk_cache_error", error=repr(exc)[:200])
        return good, bad

    def _write_disk_many(self, items: list[tuple[Chunk, bytes]]) -> None:
        """Queue verified chunks for the disk cache (written by `_writeback`)."""
        if self.disk is None or self._writes is None or not items:
            return
        for c, data in items:
            if c.digest not in self._unwritten:
                self._unwritten[c.digest] = data
                self._unwritten_bytes += len(data)
        self._writeback_wake.set()
        if self._unwritten_bytes >= self.config.writeback_max and self._writeback_wait is not None:
            self._writeback_wait.cancel()  # too much waits in memory: write now, quiet or not

    async def _reads_quiet(self, quiet: float) -> None:
        """Returns once `activity` (the FUSE layer's request count) has not moved for `quiet` s:
        a program still reading (from memory) would otherwise share the daemon's GIL with the
        write-back's per-chunk file I/O (measured: a cold start's first command 0.87 s with
        write-back during it vs 0.56 s once it was done)."""
        if self.activity is None:
            return
        while True:
            before = self.activity()
            await trio.sleep(quiet)
            if self.activity() == before or self._unwritten_bytes >= self.config.writeback_max:
                return

    async def _writeback(self) -> None:
        """Writes queued chunks to the disk cache once the foreground has been quiet for
        `writeback_quiet` seconds (or at once past `writeback_max` queued bytes), in one worker
        thread call per batch, at idle CPU priority. On exit (daemon stop) it flushes everything first. A crash loses
        at most the queue: those chunks are fetched again."""
        disk = self.disk
        while True:
            await self._writeback_wake.wait()
            self._writeback_wake = trio.Event()
            quiet = self.config.writeback_quiet
            if quiet > 0 and not self._closing and self._unwritten_bytes < self.config.writeback_max:
                with trio.move_on_after(quiet * 20) as self._writeback_wait:  # never starve for long
                    await self.gate.wait_quiet(quiet)
                    await self._reads_quiet(quiet)
                self._writeback_wait = None
            if self._unwritten and disk is not None:
                # a bounded batch, then the quiet check again: a program that starts reading
                # meanwhile waits for at most one batch of file writes, not for the whole queue
                batch, size = [], 0
                for item in self._unwritten.items():
                    batch.append(item)
                    size += len(item[1])
                    if size >= WRITEBACK_BATCH and not self._closing:
                        break
                generation = self._writeback_generation

                def put_all() -> None:
                    # at idle CPU priority: the program that just got these chunks from memory is
                    # usually still running (measured: write-back was up to 40% of the daemon's
                    # CPU samples during a cold start's first command on 2 cores)
                    with idle_thread():
                        for digest, data in batch:
                            if self._writeback_generation != generation:
                                return  # the caches were dropped meanwhile
                            disk.put(digest, data)

                try:
                    await trio.to_thread.run_sync(put_all, limiter=self._threads)
                except OSError as exc:  # a full or failing disk degrades to memory-only, never fails a read
                    self.metrics.event("disk_cache_error", error=repr(exc)[:200])
                for digest, data in batch:
                    if self._unwritten.get(digest) is data:  # not re-queued after a drop_queued
                        del self._unwritten[digest]
                        self._unwritten_bytes -= len(data)
                if self._unwritten:
                    self._writeback_wake.set()
            if self._closing and not self._unwritten:
                return


def leaf_error(exc: BaseException) -> BaseException:
    """The error a caller should see: trio nurseries wrap failures in exception groups; prefer
    the first RollstackError inside, else the first leaf."""
    if isinstance(exc, BaseExceptionGroup):
        leaves = [leaf_error(e) for e in exc.exceptions]
        for leaf in leaves:
            if isinstance(leaf, RollstackError):
                return leaf
        return leaves[0] if leaves else exc
    return exc


def _fresh(err: BaseException) -> BaseException:
    """A new instance per waiter: one exception object raised in many tasks shares a traceback."""
    if isinstance(err, RollstackError):
        return type(err)(err.message, **err.details)
    return err


def _plain(chunk: Chunk, size: int) -> Chunk:
    """The same chunk described as uncompressed bytes (what peers serve)."""
    return Chunk(offset=chunk.offset, size=chunk.size, blob_offset=0, blob_size=size, digest=chunk.digest,
                 compression=Compression.NONE)


