"""Pure planning of registry requests beyond one range (`format.ranges.coalesce` plans those):
`pack` groups range requests for multi-range GETs (several ranges, one request); `following`,
`window` and `window_back` pick the "neighbours" a demand miss drags along.
"""

from __future__ import annotations

import bisect
from typing import Callable, Iterable, Sequence

from rollstack.format.ranges import RangeRequest
from rollstack.format.toc import Chunk


def pack(requests: Sequence[RangeRequest], *, max_spans: int, max_bytes: int) -> list[tuple[RangeRequest, ...]]:
    """Consecutive range requests grouped for multi-range GETs (`store.byteranges`): at most
    `max_spans` per group and `max_bytes` stored bytes in total (a request larger than that
    travels alone). Order is kept."""
    out: list[tuple[RangeRequest, ...]] = []
    cur: list[RangeRequest] = []
    size = 0
    for r in requests:
        if cur and (len(cur) >= max_spans or size + r.length > max_bytes):
            out.append(tuple(cur))
            cur, size = [], 0
        cur.append(r)
        size += r.length
    if cur:
        out.append(tuple(cur))
    return out


def following(blob_chunks: Sequence[Chunk], offsets: Sequence[int], target: Chunk, budget: int,
              wanted: Callable[[Chunk], bool]) -> list[Chunk]:
    """Chunks stored right after `target` in the blob (`blob_chunks` sorted by blob offset,
    `offsets` their blob offsets), while they add up to at most `budget` stored bytes; only those
    `wanted` are returned, but unwanted ones still use up the window (they sit in between)."""
    i = bisect.bisect_right(offsets, target.blob_offset)
    out: list[Chunk] = []
    limit = target.blob_offset + target.blob_size + budget
    while i < len(blob_chunks):
        c = blob_chunks[i]
        if c.blob_offset + c.blob_size > limit:
            break
        if wanted(c):
            out.append(c)
        i += 1
    return out


def window(after: Iterable[Chunk], target: Chunk, budget: int, wanted: Callable[[Chunk], bool]) -> list[Chunk]:
    """Like `following`, over a lazily produced sequence of the chunks stored after `target`
    (in blob order): stops at the first chunk that ends beyond the window; chunks stored
    before `target` (shared chunks referenced again) are skipped."""
    start = target.blob_offset + target.blob_size
    limit = start + budget
    out: list[Chunk] = []
    for c in after:
        if c.blob_offset < start:
            continue
        if c.blob_offset + c.blob_size > limit:
            break
        if wanted(c):
            out.append(c)
    return out


def window_back(before: Iterable[Chunk], target: Chunk, budget: int, wanted: Callable[[Chunk], bool]) -> list[Chunk]:
    """The chunks stored just before `target`, from a lazily produced sequence in *reverse* blob
    order, while they start within `budget` bytes before it."""
    limit = target.blob_offset - budget
    out: list[Chunk] = []
    for c in before:
        if c.blob_offset >= target.blob_offset:
            continue
        if c.blob_offset < limit:
            break
        if wanted(c):
            out.append(c)
    return out
