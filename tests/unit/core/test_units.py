"""The one size parser: Kubernetes-style units, one meaning of each suffix."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollstack.core.units import GiB, MiB, parse_size, size_suffix


@pytest.mark.parametrize("text, value", [("256Mi", 256 * 2**20), ("1.5Gi", 3 * 2**29), ("512M", 512 * 10**6),
                                          ("1024", 1024), (4096, 4096), ("2GiB", 2 * GiB)])
def test_sizes(text, value):
    assert parse_size(text) == value


@given(st.text(max_size=8))
def test_parse_size_never_crashes(text):
    try:
        assert parse_size(text) >= 0
    except ValueError:
        pass


def test_decimal_and_binary_suffixes_differ() -> None:
    assert parse_size("1M") == 10**6 and parse_size("1Mi") == MiB
    assert size_suffix("1M") == "M" and size_suffix("1MiB") == "Mi" and size_suffix("12") == ""
    assert size_suffix("12Qi") is None


@pytest.mark.parametrize("bad", [True, -1, float("nan"), float("inf"), "12Qi", "", "1m", None])
def test_rejects_what_is_not_a_size(bad) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)
