"""`DiskChunkCache`: the node's chunk cache on disk, content-addressed by chunk digest.

Layout: `<dir>/sha256/<hh>/<hex>` holds the *decompressed* bytes of the chunk whose digest is
`sha256:<hex>`, so a chunk shared by layers of different repositories is stored once and a hit
needs no decompression. Writes go to `<dir>/tmp/` and are renamed into place, so a reader never
sees a torn chunk. Files written by an earlier process (which may have died mid-way, or the
machine may have lost power after the rename) are hashed once on their first read before being
trusted; a mismatch deletes the file and counts as a miss.

LRU by last use: the in-memory index is ordered by use; across restarts the order is rebuilt
from file mtimes, which a hit refreshes at most once a minute. The budget bounds the sum of
file sizes; eviction unlinks the least recently used files.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path

_TOUCH_EVERY = 60.0


_HEX64 = re.compile(r"[0-9a-f]{64}")


class DiskChunkCache:
    def __init__(self, directory: str | os.PathLike[str], budget_bytes: int) -> None:
        self.dir = Path(directory)
        self.budget = budget_bytes
        self.bytes = 0
        self.evictions = 0
        self.rejected = 0  # files found corrupt on first read
        self._index: OrderedDict[str, int] = OrderedDict()  # hex -> size
        self._verified: set[str] = set()
        self._touched: dict[str, float] = {}
        self._lock = threading.Lock()
        self._shards: set[str] = set()  # shard directories known to exist (saves a mkdir per put)
        (self.dir / "sha256").mkdir(parents=True, exist_ok=True)
        tmp = self.dir / "tmp"
        tmp.mkdir(exist_ok=True)
        for leftover in tmp.iterdir():  # a previous process died mid-write
            leftover.unlink(missing_ok=True)
        self._rebuild()

    # -- index ----------------------------------------------------------------------------
    def _rebuild(self) -> None:
        found: list[tuple[float, str, int]] = []
        for sub in (self.dir / "sha256").iterdir():
            if not sub.is_dir():
                continue
            for f in sub.iterdir():
                try:
                    st = f.stat()
                except FileNotFoundError:
                    continue
                found.append((st.st_mtime, f.name, st.st_size))
        found.sort()
        for _, hexd, size in found:
            self._index[hexd] = size
            self.bytes += size
        self._evict()

    def _path(self, hexd: str) -> Path:
        return self.dir / "sha256" / hexd[:2] / hexd

    @staticmethod
    def _hex(digest: str) -> str:
        algo, _, hexd = digest.partition(":")
        if algo != "sha256" or not _HEX64.fullmatch(hexd):
            raise ValueError(f"not a sha256 digest: {digest!r}")
        return hexd

    def __contains__(self, digest: str) -> bool:
        return digest.partition(":")[2] in self._index

    def __len__(self) -> int:
        return len(self._index)

    # -- access ---------------------------------------------------------------------------
    def get(self, digest: str) -> bytes | None:
        hexd = self._hex(digest)
        with self._lock:
            if hexd not in self._index:
                return None
            self._index.move_to_end(hexd)
            verified = hexd in self._verified
        path = self._path(hexd)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            self._forget(hexd)
            return None
        if not verified:
            if hashlib.sha256(data).hexdigest() != hexd:
                self.rejected += 1
                path.unlink(missing_ok=True)
                self._forget(hexd)
                return None
            with self._lock:
                self._verified.add(hexd)
        now = time.time()
        if now - self._touched.get(hexd, 0.0) > _TOUCH_EVERY:
            self._touched[hexd] = now
            try:
                os.utime(path)
            except FileNotFoundError:
                pass
        return data

    def put(self, digest: str, data: bytes) -> None:
        """Store verified bytes (callers verify against the digest first)."""
        hexd = self._hex(digest)
        if len(data) > self.budget:
            return
        with self._lock:
            if hexd in self._index:
                self._index.move_to_end(hexd)
                return
        path = self._path(hexd)
        if hexd[:2] not in self._shards:
            path.parent.mkdir(exist_ok=True)
            self._shards.add(hexd[:2])
        tmp = self.dir / "tmp" / f"{hexd}.{uuid.uuid4().hex[:8]}"
        with open(tmp, "wb") as f:
            f.write(data)
        try:
            os.replace(tmp, path)
        except FileNotFoundError:  # the shard directory was removed behind our back
            path.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, path)
        with self._lock:
            if hexd not in self._index:
                self._index[hexd] = len(data)
                self.bytes += len(data)
            self._verified.add(hexd)
            self._touched[hexd] = time.time()
            self._evict()

    def _forget(self, hexd: str) -> None:
        with self._lock:
            size = self._index.pop(hexd, None)
            if size is not None:
                self.bytes -= size
            self._verified.discard(hexd)
            self._touched.pop(hexd, None)

    def _evict(self) -> None:
        # caller holds the lock (or is the constructor)
        while self.bytes > self.budget and self._index:
            hexd, size = self._index.popitem(last=False)
            self.bytes -= size
            self.evictions += 1
            self._verified.discard(hexd)
            self._touched.pop(hexd, None)
            self._path(hexd).unlink(missing_ok=True)

    def clear(self) -> None:
        with self._lock:
            for hexd in list(self._index):
                self._path(hexd).unlink(missing_ok=True)
            self._index.clear()
            self._verified.clear()
            self._touched.clear()
            self.bytes = 0

    def disk_usage(self) -> int:
        """Bytes actually on disk (for tests: the index must agree with the directory)."""
        return sum(f.stat().st_size for f in (self.dir / "sha256").rglob("*") if f.is_file())
