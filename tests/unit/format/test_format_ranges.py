"""Pure read planning: adjacent chunks coalesced into bounded ranges."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from chunk_helpers import layout
from rollstack.format.ranges import coalesce


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
