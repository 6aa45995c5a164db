"""`bench materialize`'s summary math."""

from __future__ import annotations

import pytest

from rollstack_bench.materialize import LIMIT_RATIO, summarize
from rollstack.errors import InvalidRequest


def test_ratio_limit_and_core_share():
    s = summarize([1.0, 1.2, 0.8], [1.05, 1.1, 1.0], [10.0, 10.0], [2.0, 3.0])
    assert s["idle_p50_s"] == 1.0 and s["extracting_p50_s"] == 1.05
    assert s["ratio"] == pytest.approx(1.05) and s["within_limit"] and s["limit"] == LIMIT_RATIO
    assert s["extract_core_share"] == pytest.approx(0.25)
    assert not summarize([1.0], [1.2], [1.0], [0.5])["within_limit"]


def test_no_overlap_is_an_error_not_a_figure():
    with pytest.raises(InvalidRequest):
        summarize([1.0], [], [1.0], [0.1])
