"""Binary sizes (`layer convert --chunk-size`): a decimal `M` used to mean 2^20 there, so it is refused."""

import pytest

from rollstack.core.units import parse_binary_size as chunk_size_arg
from rollstack.errors import InvalidRequest


@pytest.mark.parametrize("text, value", [("65536", 65536), ("64Ki", 65536), ("1Mi", 1 << 20), ("1MiB", 1 << 20)])
def test_binary_sizes(text: str, value: int) -> None:
    assert chunk_size_arg(text) == value


@pytest.mark.parametrize("text", ["1M", "64K", "64k", "1MB"])
def test_decimal_units_are_refused_with_the_binary_spelling(text: str) -> None:
    with pytest.raises(InvalidRequest, match="i for the binary size"):
        chunk_size_arg(text)


def test_not_a_size() -> None:
    with pytest.raises(InvalidRequest, match="not a size"):
        chunk_size_arg("lots")
