"""Chunk layouts for the pure read-planning tests (format.ranges, fetch.coalesce)."""

from __future__ import annotations

from rollstack.format.toc import Chunk


def chunk(off: int, size: int) -> Chunk:
    """A stored (uncompressed) chunk of `size` bytes at blob offset `off`."""
    return Chunk(offset=0, size=size, blob_offset=off, blob_size=size, digest=f"sha256:{off:064x}")


def layout(sizes: list[int], gaps: list[int]) -> list[Chunk]:
    """Chunks of `sizes` in blob order, each after a gap of `gaps[i]` bytes."""
    out, pos = [], 0
    for size, gap in zip(sizes, gaps):
        pos += gap
        out.append(chunk(pos, size))
        pos += size
    return out
