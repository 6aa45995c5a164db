"""`MemoryChunkCache`: decompressed chunks by digest, bounded in bytes, least recently used out."""

from __future__ import annotations

import threading
from collections import OrderedDict


class MemoryChunkCache:
    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self.bytes = 0
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, digest: str) -> bytes | None:
        with self._lock:
            data = self._items.get(digest)
            if data is not None:
                self._items.move_to_end(digest)
            return data

    def __contains__(self, digest: str) -> bool:
        return digest in self._items

    def put(self, digest: str, data: bytes) -> None:
        if len(data) > self.budget:
            return  # would evict everything for one chunk; the disk cache keeps it
        with self._lock:
            old = self._items.pop(digest, None)
            if old is not None:
                self.bytes -= len(old)
            self._items[digest] = data
            self.bytes += len(data)
            while self.bytes > self.budget:
                _, evicted = self._items.popitem(last=False)
                self.bytes -= len(evicted)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)
