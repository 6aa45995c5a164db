"""The moving parts of `import_image` around the converter: the layers below, uploads.

`LowerLayers` answers the converter's questions about the layers already converted below the
current one (an implied directory's metadata, a hardlink target only a lower layer has), opening
their blobs on first use. `Uploader` uploads finished blobs on one thread, in order, while later
layers convert.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

from rollstack.plan.groups import BuiltLayer


class LowerLayers:
    """The already converted layers below the converting one, opened on first use: a source
    layer may hardlink to a file only a lower layer has (see `convert_tar`'s `lower`)."""

    def __init__(self, store: Any, repo: str) -> None:
        self._store, self._repo = store, repo
        self._layers: list[tuple[str, Path | None]] = []
        self._readers: list[Any] = []
        self._tocs: list[Any] | None = None
        self._where: dict[int, int] = {}  # id(entry) -> its layer index
        self.used = False  # the current conversion copied something up

    def push(self, digest: str, path: Path | None) -> None:
        self._layers.append((digest, path))
        self._tocs = None

    def __call__(self, path: str) -> Any:
        if not self._layers:
            return None
        self.used = True  # asked at all: the result (found or not) depends on the layers below
        if self._tocs is None:
            self._open()
        assert self._tocs is not None
        found = visible(self._tocs, path)
        if found is None:
            return None
        index, entry = found  # a lower hardlink comes back as its target (path = where the bytes are)
        self._where[id(entry)] = index
        return entry

    def payload(self, entry: Any) -> BinaryIO:
        return _EntryStream(self._readers[self._where[id(entry)]], entry)  # type: ignore[return-value]

    def _open(self) -> None:
        from rollstack.format.reader import LayerReader
        from rollstack.format.source import FileBlobSource
        from rollstack.store.source import StoreBlobSource

        self.close()
        self._readers = [LayerReader(FileBlobSource(p) if p is not None else StoreBlobSource(self._store, self._repo, d))
                         for d, p in self._layers]
        self._tocs = [r.toc for r in self._readers]

    def close(self) -> None:
        for r in self._readers:
            getattr(r.source, "close", lambda: None)()
        self._readers = []

    def __enter__(self) -> "LowerLayers":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def visible(tocs: list[Any], path: str) -> tuple[int, Any] | None:
    """(layer index, entry) that `path` shows in the overlay of `tocs` (bottom first), or None.

    Top down: the first layer with an entry at `path` decides (a whiteout: gone; a hardlink: its
    target in that layer, whose path is where the bytes are). A layer without one hides the
    layers below when it deletes an ancestor, replaces it with a non-directory, or makes it opaque."""
    from rollstack.format import paths as layer_paths
    from rollstack.format.toc import EntryType

    above = ["", *layer_paths.ancestors(path)] if path else []
    for index in range(len(tocs) - 1, -1, -1):
        toc = tocs[index]
        entry = toc.lookup(path)
        if entry is not None:
            if entry.type is EntryType.WHITEOUT:
                return None
            return index, (toc.resolve(entry) if entry.type is EntryType.HARDLINK else entry)
        for anc in above:
            a = toc.lookup(anc)
            if a is not None and (a.type is not EntryType.DIR or a.opaque):
                return None
    return None


class _EntryStream:
    """A lower layer's regular file read front to back (verified chunk by chunk)."""

    def __init__(self, reader: Any, entry: Any) -> None:
        self._reader, self._entry, self._pos = reader, entry, 0

    def read(self, n: int = -1) -> bytes:
        left = self._entry.size - self._pos
        n = left if n < 0 else min(n, left)
        if n <= 0:
            return b""
        data: bytes = self._reader.read(self._entry, self._pos, n)
        self._pos += len(data)
        return data


class Uploader:
    """Uploads finished blobs on one thread, in order, while later layers convert."""

    def __init__(self, store: Any, repo: str) -> None:
        self._store, self._repo = store, repo
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollstack-upload")
        self._futures: list[Future[bool]] = []
        self.uploaded_bytes = 0
        self.uploaded_blobs = 0

    def submit(self, layer: BuiltLayer) -> None:
        fut = self._pool.submit(self._store.put_blob, self._repo, layer.digest, layer.path)
        size = layer.size

        def counted(f: Any) -> None:
            self._count(f, size)

        fut.add_done_callback(counted)
        self._futures.append(fut)

    def _count(self, fut: Future[bool], size: int) -> None:
        if not fut.cancelled() and fut.exception() is None and fut.result():
            self.uploaded_bytes += size
            self.uploaded_blobs += 1

    def wait(self) -> None:
        for fut in self._futures:
            fut.result()  # an upload's error surfaces here

    def __enter__(self) -> "Uploader":
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
