"""Blob sources: anything with `size()` and `read_at(offset, length)`; readers need nothing else.

Every source counts its requests (`requests`, `bytes_read`) so tests and benchmarks can report
how many range reads opening or reading a layer takes; the same count holds over a registry.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Protocol, runtime_checkable

from rollstack.errors import BlobNotFound, FormatError


@runtime_checkable
class BlobSource(Protocol):
    def size(self) -> int: ...

    def read_at(self, offset: int, length: int) -> bytes:
        """Exactly `length` bytes at `offset` (the caller keeps inside [0, size()))."""
        ...


class _Counted:
    def __init__(self) -> None:
        self.requests = 0
        self.bytes_read = 0
        self._lock = threading.Lock()

    def _count(self, n: int) -> None:
        with self._lock:
            self.requests += 1
            self.bytes_read += n


class FileBlobSource(_Counted):
    """A blob in a local file, read with pread (thread-safe, no shared file position)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = Path(path)
        self._fd = -1
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise BlobNotFound(f"no such blob file: {self.path}") from None
        except OSError as exc:
            raise FormatError(f"cannot open blob {self.path}: {exc.strerror}") from None
        st = os.fstat(self._fd)
        if not stat.S_ISREG(st.st_mode):
            self.close()
            raise FormatError(f"{self.path} is not a regular file")
        self._size = st.st_size

    def size(self) -> int:
        return self._size

    def read_at(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self._size:
            raise FormatError(f"read [{offset}, {offset + length}) outside blob of {self._size} bytes")
        self._count(length)
        buf = os.pread(self._fd, length, offset)
        if len(buf) != length:  # the file shrank under us
            raise FormatError(f"{self.path}: short read at {offset} ({len(buf)} of {length} bytes)")
        return buf

    def close(self) -> None:
        # the number is taken (under the lock) before it is closed: two racing closes, or a
        # close whose os.close raised and then __del__, never close it twice (by then it may
        # be another thread's file). Reads must not race the close (the caller's to order).
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> "FileBlobSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


class BytesBlobSource(_Counted):
    """A blob held in memory (tests, freshly built layers)."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self._data = bytes(data)

    def size(self) -> int:
        return len(self._data)

    def read_at(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > len(self._data):
            raise FormatError(f"read [{offset}, {offset + length}) outside blob of {len(self._data)} bytes")
        self._count(length)
        return self._data[offset:offset + length]


class CountingBlobSource(_Counted):
    """Wraps any source to count the requests made through it."""

    def __init__(self, inner: BlobSource) -> None:
        super().__init__()
        self.inner = inner

    def size(self) -> int:
        return self.inner.size()

    def read_at(self, offset: int, length: int) -> bytes:
        self._count(length)
        return self.inner.read_at(offset, length)
