"""Opening layers by TOC, with the TOC bytes cached on disk.

Opening a layer = one size query + one tail read (sometimes a second read), done by
`format.read_toc` through a `_RecordingSource`, which keeps what it read. That tail (blob size +
the bytes from the TOC's start to the blob's end) is saved under `<dir>/<hex>.tail`; re-opening
the layer replays it through `read_toc` again, so the footer and TOC digest are re-verified and
no network is used.
"""

from __future__ import annotations

import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rollstack.errors import FormatError
from rollstack.format.reader import read_toc
from rollstack.format.toc import Toc

_HEADER = struct.Struct("<QQ")  # blob size, offset of the saved bytes


class _RecordingSource:
    def __init__(self, size: Callable[[], int], read: Callable[[int, int], bytes]) -> None:
        self._size_fn, self._read = size, read
        self._size: int | None = None
        self.segments: list[tuple[int, bytes]] = []
        self.requests = 0
        self.bytes = 0

    def size(self) -> int:
        if self._size is None:
            self._size = self._size_fn()
            self.requests += 1
        return self._size

    def read_at(self, offset: int, length: int) -> bytes:
        data = self._read(offset, length)
        self.requests += 1
        self.bytes += len(data)
        self.segments.append((offset, data))
        return data

    def tail(self) -> tuple[int, bytes]:
        """The recorded reads as one contiguous run ending at the blob's end."""
        segs = sorted(self.segments)
        start = segs[0][0]
        buf = bytearray()
        for off, data in segs:
            if off != start + len(buf):
                if off < start + len(buf):
                    buf = buf[: off - start]
                else:
                    raise FormatError("TOC reads were not contiguous")
            buf += data
        return start, bytes(buf)


class _TailSource:
    def __init__(self, size: int, start: int, data: bytes) -> None:
        self._size, self._start, self._data = size, start, data

    def size(self) -> int:
        return self._size

    def read_at(self, offset: int, length: int) -> bytes:
        if offset < self._start or offset + length > self._start + len(self._data):
            raise FormatError("cached TOC tail does not cover this read")
        i = offset - self._start
        return self._data[i:i + length]


@dataclass(frozen=True)
class OpenedLayer:
    toc: Toc
    blob_size: int
    requests: int  # network requests it took (0 when the TOC came from the disk cache)
    bytes: int  # network bytes it took
    cached: bool


class TocCache:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def _path(self, digest: str) -> Path:
        return self.dir / (digest.partition(":")[2] + ".tail")

    def open(self, digest: str, size: Callable[[], int], read: Callable[[int, int], bytes]) -> OpenedLayer:
        """Blocking. The layer's verified TOC, from disk if we have seen it, else from `read`."""
        path = self._path(digest)
        try:
            raw = path.read_bytes()
            blob_size, start = _HEADER.unpack_from(raw)
            opened = read_toc(_TailSource(blob_size, start, raw[_HEADER.size:]))
            return OpenedLayer(opened.toc, blob_size, 0, 0, True)
        except (FileNotFoundError, FormatError, struct.error):
            pass
        rec = _RecordingSource(size, read)
        opened = read_toc(rec)
        start, data = rec.tail()
        tmp = path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
        tmp.write_bytes(_HEADER.pack(opened.blob_size, start) + data)
        os.replace(tmp, path)
        return OpenedLayer(opened.toc, opened.blob_size, rec.requests, rec.bytes, False)
