"""`StoreBlobSource`: one blob in a store seen as a format `BlobSource` (`size()`, `read_at()`).

The layer reader opens a layer through this: the size is asked once and cached, every read is
one `read_blob` (one range request on a registry), exactly like `format.source`'s
`FileBlobSource` (FormatError outside the blob or on a short read). It counts requests and bytes so callers
(benchmarks, the node's `fetched_bytes`) can report what opening and reading a layer cost.
"""

from __future__ import annotations

import threading

from rollstack.errors import FormatError
from rollstack.store.base import ArtifactStore


class StoreBlobSource:
    def __init__(self, store: ArtifactStore, repo: str, digest: str, size: int | None = None) -> None:
        self.store, self.repo, self.digest = store, repo, digest
        self._size = size
        self._lock = threading.Lock()
        self.requests = 0  # store calls made (size lookups + reads)
        self.bytes_read = 0

    def __repr__(self) -> str:
        return f"StoreBlobSource({self.store.url}, {self.repo}@{self.digest})"

    def size(self) -> int:
        if self._size is None:
            size = self.store.blob_size(self.repo, self.digest)
            with self._lock:
                self.requests += 1
                self._size = size
        return self._size

    def read_at(self, offset: int, length: int) -> bytes:
        """Exactly `length` bytes at `offset`; FormatError outside [0, size()) or if short."""
        size = self.size()
        if offset < 0 or length < 0 or offset + length > size:
            raise FormatError(f"read [{offset}, {offset + length}) outside blob of {size} bytes")
        data = self.store.read_blob(self.repo, self.digest, offset, length)
        with self._lock:
            self.requests += 1
            self.bytes_read += len(data)
        if len(data) != length:
            raise FormatError(f"{self.repo}@{self.digest}: short read at {offset} ({len(data)} of {length} bytes)")
        return data
