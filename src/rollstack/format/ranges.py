"""Pure planning of blob reads: which chunks go into which byte range of the blob.

Chunks are sorted by where their stored bytes sit; neighbours whose gap is at most `max_gap`
share one range as long as it stays within `max_request` bytes. A chunk larger than
`max_request` travels alone. The lazy store's fetcher plans its range GETs with it
(`fetch.coalesce`), `reader.read_files` its reads of many small files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

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
