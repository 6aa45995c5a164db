"""Pure request planning: coalescing adjacent chunks, neighbour windows."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rollstack.fetch.coalesce import coalesce, following
from rollstack.format.toc import Chunk


def chunk(off: int, size: int) -> Chunk:
    return Chunk(offset=0, size=size, blob_offset=off, blob_size=size, digest=f"sha256:{off:064x}")


def layout(sizes: list[int], gaps: list[int]) -> list[Chunk]:
    out, pos = [], 0
    for size, gap in zip(sizes, gaps):
        pos += gap
        out.append(chunk(pos, size))
        pos += size
    return out


def test_adjacent_chunks_share_one_request():
    cs = layout([100, 100, 100], [0, 0, 0])
    plan = coalesce(cs, max_request=1000)
    assert len(plan) == 1 and plan[0].offset == 0 and plan[0].length == 300
    assert [len(r.chunks) for r in coalesce(cs, max_request=200)] == [2, 1]
    assert len(coalesce(layout([100, 100], [0, 5]), max_request=1000)) == 2
    assert len(coalesce(layout([100, 100], [0, 5]), max_request=1000, max_gap=5)) == 1


def test_a_huge_chunk_travels_alone():
    plan = coalesce(layout([10, 5000, 10], [0, 0, 0]), max_request=100)
    assert [r.length for r in plan] == [10, 5000, 10]


@given(st.lists(st.tuples(st.integers(1, 300), st.integers(0, 50)), min_size=1, max_size=60),
       st.integers(1, 2000), st.integers(0, 100))
def test_plan_covers_every_chunk_once_within_bounds(spec, max_request, max_gap):
    cs = layout([s for s, _ in spec], [g for _, g in spec])
    plan = coalesce(reversed(cs), max_request=max_request, max_gap=max_gap)
    seen = [c for r in plan for c in r.chunks]
    assert sorted(c.blob_offset for c in seen) == [c.blob_offset for c in cs]
    for r in plan:
        assert r.length <= max_request or len(r.chunks) == 1
        for c in r.chunks:
            assert r.offset <= c.blob_offset and c.blob_offset + c.blob_size <= r.end
    assert all(a.end <= b.offset for a, b in zip(plan, plan[1:]))


def test_following_window_skips_unwanted_but_counts_them():
    cs = layout([100] * 6, [0] * 6)
    offs = [c.blob_offset for c in cs]
    got = following(cs, offs, cs[0], 300, lambda c: c.blob_offset != 200)
    assert [c.blob_offset for c in got] == [100, 300]
    assert following(cs, offs, cs[5], 1000, lambda c: True) == []


def test_window_over_a_lazy_sequence_stops_early_and_skips_backrefs():
    from rollstack.fetch.coalesce import window

    cs = layout([100] * 10, [0] * 10)
    consumed = []

    def lazy():
        for c in [cs[0], *cs[2:]]:  # cs[0] re-referenced (a shared chunk stored earlier)
            consumed.append(c.blob_offset)
            yield c

    got = window(lazy(), cs[1], 250, lambda c: True)
    assert [c.blob_offset for c in got] == [200, 300]
    assert consumed == [0, 200, 300, 400]  # stopped at the first chunk beyond the window


def test_window_back_takes_the_chunks_just_before():
    from rollstack.fetch.coalesce import window_back

    cs = layout([100] * 10, [0] * 10)
    got = window_back(reversed(cs[:5]), cs[5], 250, lambda c: c.blob_offset != 400)
    assert [c.blob_offset for c in got] == [300]  # 400 unwanted, 200 is 300 bytes back: too far
