"""Chunk digesting and compression on a thread pool, committed in input order.

`LayerWriter` reads payload chunks on its own thread and hands them here. Worker threads compute
each chunk's sha256 and its zstd frame (hashlib and zstandard release the GIL, so this runs in
parallel with tar parsing and with each other); `commit` is then called for every chunk strictly
in submission order, on the caller's thread, so blob offsets, dedupe decisions and therefore
the blob bytes are exactly those of the serial writer. Every frame is still made by a
single-threaded compressor at the same level: the same input gives the same bytes with any
number of threads.

Identical chunks are compressed once: the first worker to see a digest claims it (a Future the
others share); the bytes are written at the position of the first occurrence in input order,
whichever worker compressed them. Memory is bounded: at most `max_inflight` bytes of chunk data
are queued or being worked on; claims keep only digests once their bytes are written.
"""

from __future__ import annotations

import hashlib
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import zstandard

from rollstack.format.chunk import encode_chunk
from rollstack.format.toc import Compression

Stored = tuple[bytes, Compression]
# commit(token, file_offset, size, digest, stored): `stored()` gives the chunk's stored form
Commit = Callable[[Any, int, int, str, Callable[[], Stored]], None]

_DONE: Future[Stored] = Future()
_DONE.set_result((b"", Compression.NONE))  # a claim whose bytes are already in the blob


class ChunkPipeline:
    def __init__(self, level: int, threads: int, commit: Commit, *, batch_bytes: int = 1 << 20,
                 max_inflight: int = 24 << 20) -> None:
        self._level = level
        self._commit = commit
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rollstack-chunks")
        self._local = threading.local()
        self._claims: dict[str, Future[Stored]] = {}
        self._lock = threading.Lock()
        self._batch: list[tuple[Any, int, bytes]] = []
        self._batch_bytes = 0
        self._max_batch = batch_bytes
        self._inflight: deque[tuple[Future[list[tuple[Any, int, int, str, Future[Stored]]]], int]] = deque()
        self._inflight_bytes = 0
        self._max_inflight = max_inflight

    def submit(self, token: Any, file_offset: int, data: bytes) -> None:
        """Queue one chunk; commits of earlier chunks may run now (on this thread)."""
        self._batch.append((token, file_offset, data))
        self._batch_bytes += len(data)
        if self._batch_bytes >= self._max_batch or len(self._batch) >= 256:
            self._flush()

    def drain(self) -> None:
        """Commit everything submitted so far."""
        self._flush()
        while self._inflight:
            self._drain_one()

    def close(self) -> None:
        """Stop the workers (queued work is dropped; used on errors and after `drain`)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._inflight.clear()
        self._claims.clear()

    def _flush(self) -> None:
        if self._batch:
            batch, n = self._batch, self._batch_bytes
            self._batch, self._batch_bytes = [], 0
            self._inflight.append((self._pool.submit(self._work, batch), n))
            self._inflight_bytes += n
        while self._inflight_bytes > self._max_inflight:
            self._drain_one()

    def _drain_one(self) -> None:
        fut, n = self._inflight.popleft()
        self._inflight_bytes -= n
        for token, offset, size, digest, claim in fut.result():
            self._commit(token, offset, size, digest, claim.result)
            if claim is not _DONE:
                with self._lock:
                    self._claims[digest] = _DONE  # written: drop the bytes, keep the digest

    def _work(self, batch: list[tuple[Any, int, bytes]]) -> list[tuple[Any, int, int, str, Future[Stored]]]:
        cctx = getattr(self._local, "cctx", None)
        if cctx is None:  # one single-threaded compressor per worker thread (not shareable)
            cctx = self._local.cctx = zstandard.ZstdCompressor(level=self._level)
        out = []
        for token, offset, data in batch:
            digest = "sha256:" + hashlib.sha256(data).hexdigest()
            with self._lock:
                claim = self._claims.get(digest)
                mine = claim is None
                if mine:
                    claim = self._claims[digest] = Future()
            assert claim is not None
            if mine:
                try:
                    claim.set_result(encode_chunk(data, cctx))
                except BaseException as exc:
                    claim.set_exception(exc)
                    raise
            out.append((token, offset, len(data), digest, claim))
        return out
