"""Several byte ranges of a blob in one HTTP request (RFC 9110 14.6, `multipart/byteranges`).

A trace prefetch needs hundreds of small chunks scattered over a blob. One range GET per run of
chunks costs a request each (measured on the swe-project trace: 763 GETs without gap bridging,
271 bridging gaps of up to 256 KiB, which transfers 20 MB of gap bytes); one GET for up to
`MAX_SPANS` spans costs neither. Docker's registry (Go's `http.ServeContent`) answers
multi-range requests; registries that redirect blob reads to object storage often do not, so the
caller falls back to one request per span (`read_ranges`).

Also the single-range answer helpers the registry store shares (`content_range_start`,
`slice_stream` of a full body, `read_capped`). `range_header` and `parse_byteranges` are pure. The parser trusts nothing: every part's length
comes from its `Content-Range` and must be present in full, parts are bounded in number and
header size, and each requested span must lie inside one part; anything else is `ValueError`.
"""

from __future__ import annotations

import io
import re
from typing import Any, Iterator, Sequence

from rollstack.errors import RegistryError

MAX_SPANS = 64  # spans in one request (the Range header stays ~1.5 KB)
MAX_PART_HEADERS = 8 << 10
_BOUNDARY = re.compile(r'boundary=(?:"([^"]{1,200})"|([^\s;,"]{1,200}))', re.IGNORECASE)
_CONTENT_RANGE = re.compile(rb"^content-range:\s*bytes\s+(\d{1,19})-(\d{1,19})/(?:\d{1,19}|\*)\s*$", re.IGNORECASE)

Span = tuple[int, int]  # (offset, length)


def range_header(spans: Sequence[Span]) -> str:
    """`bytes=a-b,c-d,...` for spans in increasing, non-overlapping order (each length >= 1)."""
    if not spans or len(spans) > MAX_SPANS:
        raise ValueError(f"between 1 and {MAX_SPANS} spans per request, got {len(spans)}")
    end = -1
    parts = []
    for off, n in spans:
        if n < 1 or off < 0 or off <= end:
            raise ValueError(f"spans must be non-empty, increasing and disjoint: ({off}, {n}) after end {end}")
        end = off + n - 1
        parts.append(f"{off}-{end}")
    return "bytes=" + ",".join(parts)


def boundary_of(content_type: str | None) -> str | None:
    """The boundary of a `multipart/byteranges` content type, else None."""
    if not content_type or not content_type.lower().startswith("multipart/byteranges"):
        return None
    m = _BOUNDARY.search(content_type)
    return (m.group(1) or m.group(2)) if m else None


def parse_byteranges(body: bytes, boundary: str, spans: Sequence[Span]) -> list[bytes]:
    """Each span's bytes from a `multipart/byteranges` body (parts in any order; a part may
    cover several spans: servers may coalesce nearby ranges)."""
    delim = b"--" + boundary.encode("ascii", "strict")
    parts: list[tuple[int, bytes]] = []
    pos = 0
    while True:
        while body.startswith(b"\r\n", pos):
            pos += 2
        if not body.startswith(delim, pos):
            raise ValueError("multipart/byteranges: expected a boundary")
        pos += len(delim)
        if body.startswith(b"--", pos):
            break  # the closing delimiter
        if not body.startswith(b"\r\n", pos):
            raise ValueError("multipart/byteranges: no line break after a boundary")
        pos += 2
        head_end = body.find(b"\r\n\r\n", pos, pos + MAX_PART_HEADERS)
        if head_end < 0:
            raise ValueError("multipart/byteranges: part headers missing or too long")
        rng = None
        for line in body[pos:head_end].split(b"\r\n"):
            m = _CONTENT_RANGE.match(line)
            if m:
                rng = (int(m.group(1)), int(m.group(2)))
        if rng is None or rng[1] < rng[0]:
            raise ValueError("multipart/byteranges: a part has no valid Content-Range")
        start, length = rng[0], rng[1] - rng[0] + 1
        data_at = head_end + 4
        if data_at + length > len(body):
            raise ValueError("multipart/byteranges: a part is cut short")
        parts.append((start, body[data_at:data_at + length]))
        if len(parts) > 2 * MAX_SPANS:
            raise ValueError("multipart/byteranges: too many parts")
        pos = data_at + length
    return slice_spans(parts, spans)


def slice_spans(parts: Sequence[tuple[int, bytes]], spans: Sequence[Span]) -> list[bytes]:
    """Each span's bytes out of `parts` = [(blob offset, bytes)]; a span must lie in one part."""
    out = []
    for off, n in spans:
        for start, data in parts:
            if start <= off and off + n <= start + len(data):
                out.append(data[off - start:off - start + n])
                break
        else:
            raise ValueError(f"multipart/byteranges: bytes {off}-{off + n - 1} were not in the answer")
    return out


def content_range_start(value: str | None) -> int | None:
    # "bytes 10-19/100"
    if not value or not value.startswith("bytes "):
        return None
    try:
        return int(value[6:].split("-", 1)[0])
    except ValueError:
        return None


def read_capped(resp: Any, cap: int) -> bytes:
    """The body, or RegistryError past `cap` bytes (a hostile or confused server)."""
    out = bytearray()
    for chunk in resp.iter_bytes():
        out += chunk
        if len(out) > cap:
            raise RegistryError(f"registry sent more than the {cap} bytes a multi-range answer can take")
    return bytes(out)


def slice_stream(chunks: Iterator[bytes], offset: int, length: int) -> bytes:
    """Bytes [offset, offset+length) of a full-body answer, reading no further than needed."""
    out = io.BytesIO()
    pos = 0
    for chunk in chunks:
        end = pos + len(chunk)
        if end > offset:
            out.write(chunk[max(0, offset - pos):offset + length - pos])
            if out.tell() >= length:
                break
        pos = end
    return out.getvalue()


def read_ranges(store: Any, repo: str, digest: str, spans: Sequence[Span]) -> list[bytes]:
    """Blocking: each span of a blob, in one request where the store can (`store.read_ranges`),
    else one `read_blob` per span."""
    many = getattr(store, "read_ranges", None)
    if many is not None and len(spans) > 1:
        return many(repo, digest, spans)
    return [store.read_blob(repo, digest, off, n) for off, n in spans]


def can_read_ranges(store: Any) -> bool:
    """Whether `store` reads several spans in one request (as far as it knows by now)."""
    return bool(getattr(store, "multi_range", False)) and hasattr(store, "read_ranges")
