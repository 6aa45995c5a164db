"""Trace prefetch waves: how an access trace is cut into groups of range requests.

A trace lists chunks in the order a previous environment first read them. Each wave is handed
to the fetcher as one prefetch call (coalesced into range GETs across small gaps); the waves
queue FIFO on the prefetch limiter, so the registry answers roughly in first-read order.

Waves grow: the first is small (the first bytes the program needs land after one short
request), every later one is twice the previous, up to `cap`. Fixed 512 KiB waves cost one
request per ~150 KiB on a typical trace; measured on the python-project image's 570-chunk,
17.6 MB trace over the 1 Gbit/s bench link (8 parallel prefetch requests, 256 KiB gaps), the
whole trace lands in 0.28-0.45 s with growing waves vs 0.54-0.95 s with fixed 512 KiB waves
(alternated in one run, load 10-20).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Hashable, Iterable, Sequence, TypeVar

import trio

from rollstack.fetch.stats import Account, Priority

if TYPE_CHECKING:
    from rollstack.fetch.fetcher import ChunkFetcher
    from rollstack.fetch.layer import RemoteLayer
    from rollstack.format.toc import Chunk

K = TypeVar("K", bound=Hashable)

FIRST_WAVE = 512 << 10
MAX_WAVE = 4 << 20


def plan_waves(items: Iterable[tuple[K, int]], first: int = FIRST_WAVE, cap: int = MAX_WAVE) -> list[tuple[K, list[int]]]:
    """Pure: `items` = (layer key, stored size) per trace entry, in trace order -> waves as
    (layer key, indices into `items`), in the order they should be issued. A wave holds chunks
    of one layer; a layer's open wave is closed when its stored size reaches the current limit
    (`first` doubled per closed wave, at most `cap`); waves still open at the end follow, in
    the order they were opened."""
    if first <= 0 or cap < first:
        raise ValueError("plan_waves: need 0 < first <= cap")
    closed: list[tuple[K, list[int]]] = []
    open_: dict[K, tuple[list[int], list[int]]] = {}  # layer -> (indices, [stored bytes])
    for i, (layer, size) in enumerate(items):
        idx, acc = open_.setdefault(layer, ([], [0]))
        idx.append(i)
        acc[0] += size
        if acc[0] >= min(first << min(len(closed), 30), cap):
            closed.append((layer, idx))
            del open_[layer]
    closed.extend((layer, idx) for layer, (idx, _) in open_.items())
    return closed


async def prefetch_trace(fetcher: "ChunkFetcher", trace: Sequence[tuple["RemoteLayer", "Chunk"]],
                         account: Account | None = None, first: int = FIRST_WAVE, cap: int = MAX_WAVE) -> int:
    """Fetch a trace's chunks (in first-read order) in `plan_waves` waves, all claimed at once so
    reads join their flights; the prefetch limiter (FIFO) issues them roughly in trace order.
    Returns the number of waves. The lazy store's trace prefetch and `bench prefetch` both."""
    layers: dict[str, Any] = {layer.digest: layer for layer, _ in trace}
    waves = plan_waves(((layer.digest, c.blob_size) for layer, c in trace), first=first, cap=cap)
    async with trio.open_nursery() as n:
        for digest, idx in waves:
            n.start_soon(fetcher.prefetch, layers[digest], [trace[i][1] for i in idx], account, Priority.PREFETCH)
    return len(waves)
