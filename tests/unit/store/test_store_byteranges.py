"""store.byteranges: the multi-range header and a strict multipart/byteranges parser (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollstack.store import byteranges as br

BLOB = bytes(range(256)) * 64


def multipart(parts: list[tuple[int, int]], boundary: str = "B0und", blob: bytes = BLOB, crlf_first: bool = False) -> bytes:
    out = b"\r\n" if crlf_first else b""
    for i, (a, b) in enumerate(parts):
        out += (b"\r\n" if i else b"") + f"--{boundary}\r\nContent-Type: application/octet-stream\r\n".encode()
        out += f"Content-Range: bytes {a}-{b}/{len(blob)}\r\n\r\n".encode() + blob[a:b + 1]
    return out + f"\r\n--{boundary}--\r\n".encode()


SPANS = st.lists(st.tuples(st.integers(0, len(BLOB) - 1), st.integers(1, 700)), min_size=1, max_size=20).map(
    lambda xs: _disjoint(xs))


def _disjoint(xs):
    out, end = [], -1
    for off, n in sorted(xs):
        if off > end and off + n <= len(BLOB):
            out.append((off, n))
            end = off + n - 1
    return out or [(0, 1)]


@given(SPANS, st.booleans())
def test_parse_returns_each_span_as_the_server_sent_it(spans, crlf):
    body = multipart([(o, o + n - 1) for o, n in spans][::-1], crlf_first=crlf)  # parts in any order
    assert br.parse_byteranges(body, "B0und", spans) == [BLOB[o:o + n] for o, n in spans]


def test_a_part_may_cover_several_spans():
    spans = [(10, 5), (20, 5)]
    assert br.parse_byteranges(multipart([(0, 99)]), "B0und", spans) == [BLOB[10:15], BLOB[20:25]]


def test_data_that_looks_like_a_boundary_is_data():
    blob = b"x" * 10 + b"\r\n--B0und\r\n" + b"y" * 10
    body = multipart([(0, len(blob) - 1)], blob=blob)
    assert br.parse_byteranges(body, "B0und", [(0, len(blob))]) == [blob]


@pytest.mark.parametrize("mangle", [
    lambda b: b[:-30],  # cut short
    lambda b: b.replace(b"Content-Range", b"Content-Rang"),  # no range
    lambda b: b.replace(b"--B0und", b"--Other"),  # wrong boundary
    lambda b: b.replace(b"bytes 0-9/", b"bytes 9-0/"),  # reversed range
    lambda b: b"garbage" + b,
    lambda b: b.replace(b"\r\n\r\n", b"\r\n" + b"X-Pad: y\r\n" * 1000 + b"\r\n", 1),  # headers too long
])
def test_malformed_answers_are_value_errors(mangle):
    body = multipart([(0, 9), (100, 109)])
    with pytest.raises(ValueError):
        br.parse_byteranges(mangle(body), "B0und", [(0, 10), (100, 10)])


def test_a_span_the_server_did_not_send_is_an_error():
    with pytest.raises(ValueError, match="not in the answer"):
        br.parse_byteranges(multipart([(0, 9)]), "B0und", [(0, 10), (100, 10)])


def test_range_header_and_its_limits():
    assert br.range_header([(0, 10), (100, 1)]) == "bytes=0-9,100-100"
    for bad in ([], [(5, 0)], [(10, 5), (12, 5)], [(10, 5), (0, 5)], [(i * 10, 1) for i in range(br.MAX_SPANS + 1)]):
        with pytest.raises(ValueError):
            br.range_header(bad)


def test_boundary_of_content_types():
    assert br.boundary_of("multipart/byteranges; boundary=abc") == "abc"
    assert br.boundary_of('multipart/byteranges; boundary="a b"') == "a b"
    assert br.boundary_of("application/octet-stream") is None
    assert br.boundary_of("multipart/byteranges") is None
    assert br.boundary_of(None) is None
