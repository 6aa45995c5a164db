"""`BlobBody`: a blob's bytes that an upload can send, in slices, any number of times.

Bytes in memory are hashed up front (a wrong digest never reaches the wire); a file is read
slice by slice when a request body is produced, so a multi-GB blob never sits in memory and a
retried request simply reads its slice again; a non-rewindable stream is spooled to a temp file
(hashed on the way) and the temp file is removed when the body is closed.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator

from rollstack.errors import IntegrityError, InvalidRequest
from rollstack.store import names

_BLOCK = 1 << 20


class BlobBody:
    def __init__(self, data: bytes | None, path: Path | None, size: int, owned: Path | None = None) -> None:
        self._data, self._path, self.size, self._owned = data, path, size, owned

    @classmethod
    def open(cls, data: bytes | Path | BinaryIO, digest: str) -> "BlobBody":
        if isinstance(data, (bytes, bytearray, memoryview)):
            data = bytes(data)
            got = names.sha256_digest(data)
            if got != digest:
                raise IntegrityError(f"blob bytes hash to {got}, not {digest}", digest=digest)
            return cls(data, None, len(data))
        if isinstance(data, (str, os.PathLike)):
            path = Path(data)
            if not path.is_file():
                raise InvalidRequest(f"no such file {path}")
            return cls(None, path, path.stat().st_size)
        if hasattr(data, "read"):
            # a stream may not be rewindable: spool it to a temp file (never to memory)
            fd, name = tempfile.mkstemp(prefix="rollstack-upload-")
            h = hashlib.sha256()
            with os.fdopen(fd, "wb") as out:
                for block in names.stream_blocks(data, _BLOCK):
                    h.update(block)
                    out.write(block)
            path = Path(name)
            if "sha256:" + h.hexdigest() != digest:
                path.unlink(missing_ok=True)
                raise IntegrityError(f"blob bytes hash to sha256:{h.hexdigest()}, not {digest}", digest=digest)
            return cls(None, path, path.stat().st_size, owned=path)
        raise InvalidRequest(f"blob data must be bytes, a path or a binary file, not {type(data).__name__}")

    def __enter__(self) -> "BlobBody":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._owned is not None:
            self._owned.unlink(missing_ok=True)

    def iter(self, start: int, length: int) -> Iterator[bytes] | bytes:
        if self._data is not None:
            return self._data[start:start + length]
        return self._file_slice(start, length)

    def _file_slice(self, start: int, length: int) -> Iterator[bytes]:
        assert self._path is not None
        with open(self._path, "rb") as f:
            f.seek(start)
            while length > 0:
                block = f.read(min(_BLOCK, length))
                if not block:
                    raise InvalidRequest(f"{self._path} shrank while uploading")
                length -= len(block)
                yield block


