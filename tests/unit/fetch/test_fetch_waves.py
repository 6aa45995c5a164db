"""fetch.waves: how a trace is cut into prefetch waves (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollstack.fetch.waves import plan_waves

ITEMS = st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 3 << 20)), max_size=200)


@given(ITEMS)
def test_every_entry_is_in_exactly_one_wave_of_its_own_layer_in_trace_order(items):
    waves = plan_waves(items, first=512 << 10, cap=4 << 20)
    seen = [i for _, idx in waves for i in idx]
    assert sorted(seen) == list(range(len(items)))
    for layer, idx in waves:
        assert idx == sorted(idx) and all(items[i][0] == layer for i in idx)


@given(ITEMS)
def test_waves_grow_from_first_to_cap_and_only_the_trailing_ones_are_short(items):
    first, cap = 512 << 10, 4 << 20
    waves = plan_waves(items, first=first, cap=cap)
    closed = 0
    for layer, idx in waves:
        size = sum(items[i][1] for i in idx)
        limit = min(first << closed, cap)
        without_last = size - items[idx[-1]][1]
        if size >= limit:
            assert without_last < limit  # closed by its last entry, not later
            closed += 1
        else:  # still open at the end of the trace: only the last wave of its layer
            assert all(lay != layer for lay, _ in waves[waves.index((layer, idx)) + 1:])


def test_a_small_first_wave_then_doubling():
    items = [("a", 256 << 10)] * 24  # 6 MiB of one layer
    sizes = [len(idx) for _, idx in plan_waves(items, first=512 << 10, cap=2 << 20)]
    assert sizes == [2, 4, 8, 8, 2]  # 512 KiB, 1 MiB, 2 MiB, 2 MiB (cap), the rest


def test_bad_limits_are_refused():
    with pytest.raises(ValueError):
        plan_waves([], first=0)
    with pytest.raises(ValueError):
        plan_waves([], first=4, cap=2)


def test_pack_groups_consecutive_requests_by_count_and_bytes():
    from rollstack.fetch.coalesce import pack
    from rollstack.format.ranges import RangeRequest

    reqs = [RangeRequest(i * 100, 10 * (i + 1), ()) for i in range(10)]
    groups = pack(reqs, max_spans=3, max_bytes=100)
    assert [r for g in groups for r in g] == reqs  # order kept, nothing lost
    assert all(len(g) <= 3 for g in groups)
    assert all(sum(r.length for r in g) <= 100 or len(g) == 1 for g in groups)
    assert pack([RangeRequest(0, 500, ())], max_spans=3, max_bytes=100) == [(RangeRequest(0, 500, ()),)]  # alone
