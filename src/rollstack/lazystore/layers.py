"""`LayerTable`: the layers a lazy store daemon serves, and their inode ranges.

Each loaded layer has one `LayerIndex` (its TOC as inodes, one contiguous range starting at its
base) and one `RemoteLayer` (its blob, for the fetcher). Adding a layer reads its TOC (from the
TOC cache on disk, else by range reads of the blob) in a worker thread; the same layer added
concurrently is loaded once.

Inode continuity across a daemon takeover (lazystore/holder.py): the kernel knows the inodes, so a
daemon that takes the connection over must serve the same numbers. Every added layer rewrites
`<state_dir>/layers.json` (repo, digest, base of every layer), in a worker thread, one write
at a time; `restore` loads that record at the same bases.
"""

from __future__ import annotations

import bisect
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import trio

from rollstack.errors import InvalidRequest, NotFound
from rollstack.fetch import RemoteLayer
from rollstack.host import atomic
from rollstack.format.erofs import BlobMap
from rollstack.lazystore.index import LayerIndex
from rollstack.lazystore.tocs import TocCache
from rollstack.store import byteranges

FIRST_LAYER_INODE = 1000
SMALL_LAYER = 5000  # entries: below this, hardlink counts are computed while adding the layer
PREPARE_DELAY = 5.0  # seconds after adding a big layer before its hardlink scan


@dataclass
class LoadedLayer:
    repo: str
    digest: str
    index: LayerIndex
    remote: RemoteLayer
    blob_size: int
    info: dict[str, Any]
    blob_map: BlobMap | None = None  # the layer's EROFS data blob (`/blobs/<hex>`), once asked for

    @property
    def blob_inode(self) -> int:
        """The inode of `/blobs/<hex>`: the first one after the layer's range (every base leaves
        a gap of 16, so it is never another layer's)."""
        return self.index.base + self.index.size


def digest_hex(digest: str) -> str:
    algo, _, hexd = digest.partition(":")
    if algo != "sha256" or len(hexd) != 64:
        raise InvalidRequest(f"not a sha256 digest: {digest!r}")
    return hexd


def layer_ref(ref: Any) -> tuple[str, str]:
    """(repo, digest) from a dict or an object with .repo/.digest (e.g. plan.LayerRef)."""
    if isinstance(ref, dict):
        repo, digest = ref.get("repo"), ref.get("digest")
    else:
        repo, digest = getattr(ref, "repo", None), getattr(ref, "digest", None)
    if not isinstance(repo, str) or not isinstance(digest, str):
        raise InvalidRequest(f"a layer reference needs 'repo' and 'digest': {ref!r}")
    digest_hex(digest)
    return repo, digest


NoXattrHook = Callable[[list[tuple[int, int]], frozenset[int]], None]
"""Called with the inode ranges that have no xattrs and the exceptions inside them (the FUSE
layer's fast path, lazystore/fs.py)."""


class LayerTable:
    def __init__(self, store: Any, mountpoint: Path, state_dir: Path, spawn: Callable[..., None]) -> None:
        self.store = store
        self.mountpoint = mountpoint
        self.tocs = TocCache(state_dir / "tocs")
        self.record_path = state_dir / "layers.json"
        self._spawn = spawn  # runs a background task (the fetcher's nursery)
        self.by_hex: dict[str, LoadedLayer] = {}
        self._bases: list[int] = []
        self._base_layers: list[LoadedLayer] = []
        self._next_base = FIRST_LAYER_INODE
        self._kept_bases: dict[str, int] = {}  # layer hex -> inode base to reuse (takeover)
        self._loading: dict[str, trio.Event] = {}
        self._record_lock = trio.Lock()
        self.changed_ns = time.time_ns()  # mtime of /layers (kernel listing caches)
        self.no_xattr_hook: NoXattrHook | None = None

    # -- lookups (FUSE hot path: no I/O) -----------------------------------------------------
    def __len__(self) -> int:
        return len(self.by_hex)

    def get(self, hexd: str) -> LoadedLayer | None:
        return self.by_hex.get(hexd)

    def items(self) -> Iterable[tuple[str, LoadedLayer]]:
        return self.by_hex.items()

    def __iter__(self) -> Iterator[LoadedLayer]:
        return iter(list(self.by_hex.values()))

    def _at_or_below(self, ino: int) -> LoadedLayer | None:
        """The layer with the highest base <= `ino`."""
        i = bisect.bisect_right(self._bases, ino) - 1
        return self._base_layers[i] if i >= 0 else None

    def of_inode(self, ino: int) -> LoadedLayer | None:
        layer = self._at_or_below(ino)
        return layer if layer is not None and layer.index.owns(ino) else None

    def of_blob_inode(self, ino: int) -> LoadedLayer | None:
        """The layer whose `/blobs/<hex>` file has inode `ino`."""
        layer = self._at_or_below(ino)
        return layer if layer is not None and ino == layer.blob_inode else None

    async def blob_map(self, layer: LoadedLayer) -> BlobMap:
        """The layer's blob extents (format.erofs), computed once in a worker thread (from the
        TOC's record columns: ~9 ms for 62k entries)."""
        if layer.blob_map is None:
            layer.blob_map = await trio.to_thread.run_sync(BlobMap.of, layer.index.toc)
        return layer.blob_map

    def loaded(self, digest: str) -> LoadedLayer:
        layer = self.by_hex.get(digest_hex(digest))
        if layer is None:
            raise NotFound(f"layer {digest} is not loaded (add it first)")
        return layer

    def dir_of(self, digest: str) -> Path:
        return self.mountpoint / "layers" / digest_hex(digest)

    # -- adding ------------------------------------------------------------------------------
    async def add(self, refs: Iterable[Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        pairs = [layer_ref(r) for r in refs]
        results: dict[str, dict[str, Any]] = {}
        async with trio.open_nursery() as n:
            for repo, digest in pairs:
                n.start_soon(self._add_one, repo, digest, results)
        out = [results[d] for _, d in pairs]
        return {"layers": out, "seconds": round(time.perf_counter() - t0, 6),
                "bytes": sum(r["toc_bytes"] for r in out), "requests": sum(r["toc_requests"] for r in out)}

    async def _add_one(self, repo: str, digest: str, results: dict[str, dict[str, Any]]) -> None:
        hexd = digest_hex(digest)
        while hexd in self._loading:
            await self._loading[hexd].wait()
        if hexd in self.by_hex:
            results[digest] = dict(self.by_hex[hexd].info, loaded=True, toc_requests=0, toc_bytes=0, toc_seconds=0.0)
            return
        done = self._loading[hexd] = trio.Event()
        try:
            t0 = time.perf_counter()
            store = self.store
            opened = await trio.to_thread.run_sync(
                self.tocs.open, digest, lambda: store.blob_size(repo, digest),
                lambda off, n: store.read_blob(repo, digest, off, n))
            base = self._kept_bases.get(hexd, self._next_base)
            index = LayerIndex(digest, opened.toc, base)
            self._next_base = max(self._next_base, base + index.size + 16)
            toc = opened.toc
            remote = RemoteLayer(repo, digest, lambda off, n: store.read_blob(repo, digest, off, n),
                                 lambda: (c for e in toc for c in e.chunks),
                                 read_ranges=lambda spans: byteranges.read_ranges(store, repo, digest, spans),
                                 multi_range=lambda: byteranges.can_read_ranges(store))
            info = {"repo": repo, "digest": digest, "entries": len(toc), "blob_size": opened.blob_size,
                    "toc_cached": opened.cached, "toc_requests": opened.requests, "toc_bytes": opened.bytes,
                    "toc_seconds": round(time.perf_counter() - t0, 6), "loaded": False,
                    "dir": str(self.dir_of(digest))}
            layer = LoadedLayer(repo, digest, index, remote, opened.blob_size, info)
            async with self._record_lock:
                # recorded before it is served: a successor must know every base the kernel saw
                await self._record(layer)
                self.by_hex[hexd] = layer
                self.changed_ns = time.time_ns()
                i = bisect.bisect(self._bases, base)
                self._bases.insert(i, base)
                self._base_layers.insert(i, layer)
            results[digest] = info
            self.publish_xattr_ranges()  # xattr-free inodes from the TOC's records: ~1 ms
            if len(toc) <= SMALL_LAYER:
                index.hardlinks()  # a few ms: exact link counts from the first getattr on
            else:
                self._spawn(self._prepare, layer)
        finally:
            del self._loading[hexd]
            done.set()

    async def _prepare(self, layer: LoadedLayer) -> None:
        """Off the critical path: hardlink counts of a big layer (materialises every entry, ~0.1 s
        of CPU for 30k entries). Delayed so it does not compete for the GIL with the reads of the
        environment that is starting right now."""
        await trio.sleep(PREPARE_DELAY)
        await trio.to_thread.run_sync(layer.index.hardlinks)

    def publish_xattr_ranges(self) -> None:
        """Tell the FUSE layer which inodes have no xattrs (every scanned layer's range, minus its
        inodes with xattrs), so overlayfs' `trusted.overlay.*` probes are answered without Python."""
        if self.no_xattr_hook is None:
            return
        ranges: list[tuple[int, int]] = []
        inodes: set[int] = set()
        for layer in self._base_layers:
            ranges.append((layer.index.base, layer.index.base + layer.index.size))
            inodes |= layer.index.xattr_inodes
        self.no_xattr_hook(ranges, frozenset(inodes))

    # -- the inode record (takeover) -----------------------------------------------------------
    async def _record(self, new: LoadedLayer) -> None:
        """Rewrite the record of loaded layers and their bases, `new` included, in a worker
        thread (the caller holds `_record_lock`: one write at a time)."""
        doc = [{"repo": la.repo, "digest": la.digest, "base": la.index.base} for la in [*self._base_layers, new]]
        await trio.to_thread.run_sync(atomic.replace, self.record_path, json.dumps(doc).encode())

    def forget_record(self) -> None:
        """A fresh mount: inode numbers start over (before the FUSE loop runs)."""
        self.record_path.unlink(missing_ok=True)

    async def restore(self) -> dict[str, Any]:
        """Load the layers a previous daemon served on this connection, at the same inode
        bases (TOCs come from the TOC cache on disk)."""
        try:
            text = await trio.to_thread.run_sync(self.record_path.read_text)
        except FileNotFoundError:
            return {"layers": [], "seconds": 0.0, "bytes": 0, "requests": 0}
        try:
            kept = {digest_hex(d["digest"]): (d["repo"], d["digest"], int(d["base"])) for d in json.loads(text)}
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidRequest(f"{self.record_path}: unreadable layer record ({exc})") from None
        self._kept_bases = {h: base for h, (_, _, base) in kept.items()}
        return await self.add({"repo": r, "digest": d} for r, d, _ in kept.values())

