"""The one percentile: linear interpolation, None for no values."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollstack.core.stats import percentile


def test_interpolates_between_order_statistics() -> None:
    assert percentile([1, 2], 50) == 1.5 and percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([3, 1, 2], 0) == 1 and percentile([3, 1, 2], 100) == 3
    assert percentile([10], 95) == 10


def test_no_values_is_none_and_missing_values_are_ignored() -> None:
    assert percentile([], 50) is None
    assert percentile([None, float("nan")], 50) is None
    assert percentile([float("nan"), 4.0, None], 50) == 4.0


def test_q_outside_range_is_an_error() -> None:
    for q in (-1, 101):
        with pytest.raises(ValueError):
            percentile([1.0], q)
    with pytest.raises(ValueError):
        percentile([], 101)


@settings(deadline=None)  # the CI machine is shared: wall-clock deadlines would be flaky
@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1, max_size=50),
       st.floats(min_value=0, max_value=100))
def test_lies_within_the_values(values: list[float], q: float) -> None:
    p = percentile(values, q)
    assert p is not None and min(values) - 1e-9 <= p <= max(values) + 1e-9
    assert percentile(values, 0) == min(values) and percentile(values, 100) == max(values)
