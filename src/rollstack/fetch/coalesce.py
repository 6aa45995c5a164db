"""Pure planning of registry requests: which chunks go into which range GET.

Chunks of one blob are sorted by where their stored bytes sit; neighbours whose gap is at most
`max_gap` share one request as long as it stays within `max_request` bytes. A chunk larger than
`max_request` travels alone. The same planner picks the "neighbours" a demand miss drags along.
`pack` groups requests for multi-range GETs (several ranges, one request).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from rollstack.format.toc import Chunk


@dataclass(frozen=True)
class RangeRequest:
    offset: int
    length: int
    chunks: tuple[Chunk, ...]

    @property
    def end(self) -> int:
        return self.offset + self.length


def coalesce(chunks: Iterable[Chunk], *, max_request: int, max_gap: int = 0) -> list[RangeRequest]:
    """Group chunks into range requests (deduplicated by blob offset, in blob order)."""
    by_offset: dict[int, Chunk] = {}
    for c in chunks:
        by_offset.setdefault(c.blob_offset, c)
    out: list[RangeRequest] = []
    cur: list[Chunk] = []
    start = end = 0
    for off in sorted(by_offset):
        c = by_offset[off]
        c_end = c.blob_offset + c.blob_size
        if cur and c.blob_offset - end <= max_gap and max(end, c_end) - start <= max_request:
            cur.append(c)
            end = max(end, c_end)
            continue
        if cur:
            out.append(RangeRequest(start, end - start, tuple(cur)))
        cur, start, end = [c], c.blob_offset, c_end
    if cur:
        out.append(RangeRequest(start, end - start, tuple(cur)))
    return out


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
