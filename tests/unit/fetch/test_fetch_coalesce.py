"""Pure request planning: neighbour windows (coalescing: tests/unit/format/test_format_ranges.py)."""

from __future__ import annotations

from chunk_helpers import layout
from rollstack.fetch.coalesce import following


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
