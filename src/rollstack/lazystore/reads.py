"""`Reads`: file reads of the lazy store, and what they start beside them.

A read names its chunks, asks the fetcher for them (memory -> disk -> peers -> registry, with
neighbour windows), records them into the reading environment's access trace, and keeps
sequential readers' next bytes in flight (readahead). The first registry miss in a directory
can prefetch the directory's small files (`FetchConfig.dir_prefetch_bytes`). `chunk_bytes`
serves the chunks this daemon holds to peers.

Open files: with `open` (kernel-open mode) the read state lives under a file handle; in no-open
mode (lazystore/fs.py) the kernel sends no OPEN, so the state is kept per inode for the most recent
UNOPENED_STATES inodes, and the environment is the reader's.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import trio

from rollstack.errors import InvalidRequest, NotFound
from rollstack.fetch import ChunkFetcher, DiskChunkCache, FetchConfig, MemoryChunkCache, Priority
from rollstack.format.erofs import BlobMap
from rollstack.format.toc import Chunk, EntryType, TocEntry
from rollstack.lazystore.envs import Env, EnvTable
from rollstack.lazystore.layers import LayerTable, LoadedLayer

READAHEAD_BATCH = 4 << 20  # stored bytes: the smallest readahead top-up
UNOPENED_STATES = 4096  # no-open mode: per-inode read states kept (sequential-read detection)


@dataclass
class OpenFile:
    layer: LoadedLayer
    ino: int
    entry: TocEntry
    env: Env | None
    next_off: int = 0
    ahead_until: int = -1  # highest chunk index readahead was issued for
    chunk_offsets: list[int] | None = None


class Reads:
    def __init__(self, config: FetchConfig, layers: LayerTable, envs: EnvTable, fetcher: ChunkFetcher,
                 memory: MemoryChunkCache, disk: DiskChunkCache) -> None:
        self.config = config
        self.layers, self.envs = layers, envs
        self.fetcher, self.memory, self.disk = fetcher, memory, disk
        self.files: dict[int, OpenFile] = {}
        self._next_fh = 1
        self.unopened: dict[int, OpenFile] = {}  # no-open mode: read state per inode, LRU
        self._dirs_prefetched: set[tuple[str, str]] = set()  # (layer digest, directory path)

    def open_file(self, ino: int, pid: int) -> int:
        layer = self.layers.of_inode(ino)
        if layer is None:
            raise NotFound(f"inode {ino}")
        fh = self._next_fh
        self._next_fh += 1
        entry = layer.index.entry(ino)
        of = self.files[fh] = OpenFile(layer, ino, entry, self.envs.for_pid(pid))
        if self.config.fetch_on_open and entry.chunks:
            # the first read is coming: start its miss now (a no-op if cached or in flight)
            c = entry.chunks[0]
            if c.digest not in self.memory:
                index = layer.index
                same_dir = self.config.neighbor_same_dir
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
        return await self._read(self._unopened_state(ino), self.envs.for_pid(pid), off, size)

    def _unopened_state(self, ino: int) -> OpenFile:
        of = self.unopened.pop(ino, None)
        if of is None:
            layer = self.layers.of_inode(ino)
            if layer is None:
                raise NotFound(f"inode {ino}")
            entry = layer.index.entry(ino)
            if entry.type is not EntryType.REG:
                raise InvalidRequest(f"inode {ino} is not a regular file")
            of = OpenFile(layer, ino, entry, None)
            if len(self.unopened) >= UNOPENED_STATES:
                del self.unopened[next(iter(self.unopened))]
        self.unopened[ino] = of  # most recent last
        return of

    async def read_blob(self, layer: LoadedLayer, blob: BlobMap, off: int, size: int, pid: int) -> bytes:
        """A read of the layer's EROFS data blob (`/blobs/<hex>`, format.erofs): the byte range is
        cut into the files it covers (each read like a file read, so fetch, traces and readahead
        work as they do for the FUSE tree) and the padding between them (zeros)."""
        pieces = blob.pieces(off, size)
        if not pieces:
            return b""
        env = self.envs.for_pid(pid)
        out = bytearray(pieces[-1][3] + pieces[-1][2])

        async def one(pos: int, foff: int, n: int, at: int) -> None:
            data = await self._read(self._unopened_state(layer.index.inode_at(pos)), env, foff, n)
            out[at:at + len(data)] = data

        files = [p for p in pieces if p[0] >= 0]
        if len(files) == 1:
            await one(*files[0])
        elif files:
            async with trio.open_nursery() as nursery:
                for p in files:
                    nursery.start_soon(one, *p)
        return bytes(out)

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
        same_dir = self.config.neighbor_same_dir
        after = index.chunks_after(of.ino, chunks[-1].offset, same_dir)
        before = index.chunks_before(of.ino, same_dir) if chunks[0].offset == 0 else None
        if self.config.dir_prefetch_bytes and self.fetcher.would_fetch(chunks[0]):
            self._dir_prefetch(of, acct)
        datas = await self.fetcher.get_many(of.layer.remote, chunks, acct, used, after, before)
        if env is not None and env.recorder is not None:
            for c in chunks:
                env.recorder.record(of.layer.digest, c)
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
        cfg = self.config
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
        budget = self.config.readahead_bytes
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
