"""Property test of the pure TOC codec: any entry set survives encode -> decode unchanged."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from rollstack.errors import FormatError
from rollstack.format import toc_codec
from rollstack.format.toc import Chunk, Compression, EntryType, Toc, TocEntry

SEGMENT = st.text(st.characters(blacklist_characters="/\0", blacklist_categories=("Cs",)), min_size=1, max_size=8).filter(
    lambda s: s not in (".", ".."))
SURROGATE_SEGMENT = st.binary(min_size=1, max_size=6).filter(lambda b: b"/" not in b and b"\0" not in b and b not in (b".", b"..")).map(
    lambda b: b.decode("utf-8", "surrogateescape"))
PATHS = st.lists(st.one_of(SEGMENT, SURROGATE_SEGMENT), min_size=1, max_size=4).map("/".join)

CHUNKS = st.lists(st.builds(
    Chunk, st.integers(0, 2**63), st.integers(0, 2**32 - 1), st.integers(0, 2**63), st.integers(0, 2**32 - 1),
    st.binary(min_size=1, max_size=4).map(lambda b: "sha256:" + hashlib.sha256(b).hexdigest()),
    st.sampled_from(list(Compression))), max_size=3)

ENTRIES = st.builds(
    TocEntry, PATHS, st.sampled_from(list(EntryType)), st.integers(0, 0o7777), st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1), st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**64 - 1),
    st.text(max_size=20).filter(lambda s: "\0" not in s), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1),
    st.dictionaries(st.text(min_size=1, max_size=10), st.binary(max_size=20), max_size=3), st.booleans(), CHUNKS)


@settings(max_examples=40, deadline=None)
@given(st.lists(ENTRIES, max_size=30, unique_by=lambda e: e.path))
def test_codec_round_trip(entries: list[TocEntry]) -> None:
    toc = Toc(entries)
    back = toc_codec.decode(toc_codec.encode(toc, 3))
    assert back.paths == toc.paths
    for p in toc.paths:  # lazy one-by-one path
        assert back.lookup(p) == toc.lookup(p)
    assert toc_codec.decode(toc_codec.encode(toc, 3)).entries == toc.entries  # bulk path


@settings(max_examples=60, deadline=None)
@given(st.lists(ENTRIES, max_size=30, unique_by=lambda e: e.path))
def test_xattr_scan_of_the_record_column_matches_the_entries(entries: list[TocEntry]) -> None:
    toc = Toc(entries)
    expected = [i for i, e in enumerate(toc.entries) if e.xattrs or e.opaque]
    back = toc_codec.decode(toc_codec.encode(toc, 3))
    assert back.xattr_indices() == expected  # before any entry is built
    assert back.entries == toc.entries and back.xattr_indices() == expected  # and after


@settings(max_examples=40, deadline=None)
@given(st.lists(ENTRIES, min_size=1, max_size=5, unique_by=lambda e: e.path), st.data())
def test_codec_rejects_any_single_corruption(entries: list[TocEntry], data: st.DataObject) -> None:
    """A damaged raw TOC decodes to the same entries or raises FormatError: never anything else."""
    raw = bytearray(toc_codec.encode_raw(Toc(entries).entries))
    pos = data.draw(st.integers(0, len(raw) - 1))
    raw[pos] ^= data.draw(st.integers(1, 255))
    try:
        toc = toc_codec.decode_raw(bytes(raw))
        toc.entries
    except FormatError:
        pass
