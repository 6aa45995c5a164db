"""`RemoteLayer`: what the fetcher needs to know about one layer blob.

Where its bytes come from (a blocking range read, normally `store.read_blob`; several ranges in
one request where the store can), and all its
chunks in blob order (for neighbour and background planning). The chunk list needs every TOC
entry, so it is built off the critical path (`build_index`, run in a worker thread) and is
simply absent until then: a miss then fetches just what it needs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable

from rollstack.format.toc import Chunk


@dataclass
class RemoteLayer:
    repo: str
    digest: str
    read_range: Callable[[int, int], bytes]
    """Blocking: stored bytes [offset, offset+length) of the blob."""
    list_chunks: Callable[[], Iterable[Chunk]] | None = None
    """Blocking: every chunk of the layer (any order); called once by `build_index`."""
    read_ranges: Callable[[list[tuple[int, int]]], list[bytes]] | None = None
    """Blocking: several disjoint spans [(offset, length)] of the blob in one request
    (`store.byteranges`); None: the store cannot."""
    multi_range: Callable[[], bool] = lambda: False
    """Whether `read_ranges` is worth planning for right now (the store may learn it is not)."""
    chunks: list[Chunk] | None = field(default=None, repr=False)
    offsets: list[int] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def build_index(self) -> None:
        with self._lock:
            if self.chunks is not None or self.list_chunks is None:
                return
            seen: dict[int, Chunk] = {}
            for c in self.list_chunks():
                seen.setdefault(c.blob_offset, c)
            chunks = [seen[o] for o in sorted(seen)]
            self.offsets = [c.blob_offset for c in chunks]
            self.chunks = chunks

    @property
    def stored_bytes(self) -> int:
        return sum(c.blob_size for c in self.chunks or ())
