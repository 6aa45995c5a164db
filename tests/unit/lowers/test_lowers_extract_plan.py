"""`lowers.extract.plan_ranges`: which blob ranges materialization reads (pure)."""

from __future__ import annotations

from hypothesis import given, strategies as st

from rollstack.format.toc import Chunk
from rollstack.lowers.extract import plan_ranges


def chunks(sizes: list[int]) -> list[Chunk]:
    out, off = [], 0
    for i, s in enumerate(sizes):
        out.append(Chunk(0, s, off, s, f"sha256:{i:064x}"))
        off += s
    return out


def test_adjacent_missing_chunks_are_one_read_and_cached_ones_are_skipped():
    cs = chunks([100, 100, 100, 1 << 20, 100])
    missing = {cs[0].blob_offset, cs[1].blob_offset, cs[4].blob_offset}
    assert plan_ranges(cs, missing, gap=1000) == [(0, 200), (cs[4].blob_offset, 100)]  # 1 MiB cached gap not read
    assert plan_ranges(cs, missing, gap=2 << 20) == [(0, cs[4].blob_offset + 100)]  # small gaps are read through
    assert plan_ranges(cs, set()) == []


def test_a_window_bounds_each_read():
    cs = chunks([1000] * 10)
    assert plan_ranges(cs, {c.blob_offset for c in cs}, window=3000) == [(0, 3000), (3000, 3000), (6000, 3000), (9000, 1000)]


@given(st.lists(st.integers(1, 5000), min_size=1, max_size=40), st.data())
def test_every_missing_chunk_is_covered_once_in_order(sizes, data):
    cs = chunks(sizes)
    missing = {c.blob_offset for c in cs if data.draw(st.booleans())}
    window = data.draw(st.integers(1, 20000))
    ranges = plan_ranges(cs, missing, window=window, gap=data.draw(st.integers(0, 10000)))
    assert all(a[0] + a[1] <= b[0] for a, b in zip(ranges, ranges[1:]))
    for c in cs:
        if c.blob_offset in missing:
            assert sum(1 for o, n in ranges if o <= c.blob_offset and c.blob_offset + c.blob_size <= o + n) == 1
    for o, n in ranges:
        inside = [c for c in cs if o <= c.blob_offset < o + n]
        assert n <= window or len(inside) == 1
