"""A bounded pipe of byte blocks from a producer thread to a reader, as a read-only file.

    pipe = BlockPipe(maxblocks=16)
    # producer thread:  pipe.put(block) ...; pipe.put(END) (or pipe.put(exc): the reader raises it)
    data = pipe.read(n)   # n bytes, fewer only at the end; b"" after END
    pipe.stop()           # the reader leaves: a producer blocked in put() returns

`put` blocks while `maxblocks` blocks wait (memory stays bounded by the reader's pace) and gives
up once `stop()` was called, so a producer never hangs on an abandoned reader.
"""

from __future__ import annotations

import queue
import threading
from typing import Union

END = None
"""What the producer puts after its last block."""

Item = Union[bytes, BaseException, None]


class BlockPipe:
    def __init__(self, maxblocks: int = 16) -> None:
        self._queue: queue.Queue[Item] = queue.Queue(maxblocks)
        self._stop = threading.Event()
        self._buf = b""
        self._off = 0
        self._eof = False

    # -- the producer ----------------------------------------------------------------------------
    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def put(self, item: Item) -> None:
        """A block, `END`, or the exception the reader raises instead of reading on; waits while
        the pipe is full, and returns without putting once the reader has stopped."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    # -- the reader ------------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            parts = [self._buf[self._off:]]
            while block := self._next():
                parts.append(block)
            self._buf, self._off = b"", 0
            return b"".join(parts)
        avail = len(self._buf) - self._off
        if avail >= n:
            self._off += n
            return self._buf[self._off - n:self._off]
        parts = [self._buf[self._off:]] if avail else []
        got = avail
        self._buf, self._off = b"", 0
        while got < n:
            block = self._next()
            if not block:
                break
            if got + len(block) > n:
                take = n - got
                parts.append(block[:take])
                self._buf, self._off = block, take
                got = n
                break
            parts.append(block)
            got += len(block)
        return b"".join(parts)

    def _next(self) -> bytes:
        if self._eof:
            return b""
        item = self._queue.get()
        if item is None:
            self._eof = True
            return b""
        if isinstance(item, BaseException):
            self._eof = True
            raise item
        return item
