"""format/erofs.py without a kernel: the blob's extents and the read mapping over them, the image's
superblock and inode placement, and what the format cannot say (FormatError, never a bad image).
The kernel-mounted checks are tests/integration/lazystore/test_lazystore_erofs.py."""

from __future__ import annotations

from rollstack.format import toc_codec

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollstack.errors import FormatError
from rollstack.format import erofs
from rollstack.format.toc import EntryType, Toc, TocEntry


def _toc(*entries: TocEntry) -> Toc:
    return Toc([TocEntry(path="", type=EntryType.DIR, mode=0o755), *entries])


def _files(sizes: list[int]) -> Toc:
    return _toc(*(TocEntry(path=f"f{i:03d}", type=EntryType.REG, size=s) for i, s in enumerate(sizes)))


def test_extents_are_block_aligned_in_toc_order_and_skip_empty_files():
    toc = _toc(TocEntry(path="a", type=EntryType.REG, size=1),
               TocEntry(path="b", type=EntryType.REG, size=0),
               TocEntry(path="c", type=EntryType.REG, size=4097),
               TocEntry(path="d", type=EntryType.HARDLINK, link="a"),
               TocEntry(path="e", type=EntryType.REG, size=4096))
    assert erofs.blob_extents(toc) == [(1, 0, 1), (3, 1, 4097), (5, 3, 4096)]
    assert erofs.BlobMap.of(toc).size == 4 * 4096


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3 * 4096), min_size=0, max_size=12), st.integers(0, 80_000), st.integers(0, 40_000))
def test_pieces_cover_a_read_exactly(sizes, off, size):
    toc = _files(sizes)
    bm = erofs.BlobMap.of(toc)
    pieces = bm.pieces(off, size)
    want = max(0, min(bm.size, off + size) - off) if off < bm.size else 0
    assert sum(n for _, _, n, _ in pieces) == want
    at = 0
    for pos, foff, n, reply_at in pieces:
        assert reply_at == at and n > 0
        at += n
        if pos >= 0:
            e = toc.entries[pos]
            assert e.type is EntryType.REG and 0 <= foff and foff + n <= e.size
    # the file bytes a piece names are the ones at that blob offset
    starts = {p: b * 4096 for p, b, _ in erofs.blob_extents(toc)}
    for pos, foff, n, reply_at in pieces:
        if pos >= 0:
            assert starts[pos] + foff == off + reply_at


def test_image_superblock_device_slot_and_root():
    toc = _files([10, 5000])
    img, blob = erofs.build(toc, "sha256:" + "0" * 64)
    magic, _, _, bits, _, root, inos = struct.unpack_from("<IIIBBHQ", img, 1024)
    assert (magic, bits, root, inos) == (erofs.MAGIC, 12, erofs.FIRST_INODE // 32, 3)
    incompat, _, extra, slotoff = struct.unpack_from("<IHHH", img, 1024 + 80)
    assert incompat == erofs.INCOMPAT_CHUNKED_FILE | erofs.INCOMPAT_DEVICE_TABLE and (extra, slotoff) == (1, 9)
    tag, blocks = struct.unpack_from("<64sI", img, 1152)
    assert tag == b"0" * 64 and blocks == 3 and blob == 3 * 4096
    assert len(img) % 4096 == 0


def test_inode_records_never_cross_a_block():
    # many xattrs make records of odd sizes; none may straddle a block boundary
    entries = [TocEntry(path=f"d{i:04d}", type=EntryType.REG, size=i % 3,
                        xattrs={f"user.k{j}": b"v" * (i % 50) for j in range(i % 7)}) for i in range(600)]
    image = erofs.ErofsImage(_toc(*entries))
    image.encode()
    for n in image.nodes:
        size = erofs.INODE_SIZE + len(n.xattrs)
        if n.layout == erofs.FLAT_INLINE:
            size += len(n.data)
        elif n.layout == erofs.CHUNK_BASED:
            size += -size % 8 + 8
        assert n.offset % 32 == 0 and n.offset // 4096 == (n.offset + size - 1) // 4096


def test_hardlinks_share_an_inode_and_count_links_even_before_their_target():
    toc = _toc(TocEntry(path="a", type=EntryType.HARDLINK, link="z"),
               TocEntry(path="z", type=EntryType.REG, size=3))
    image = erofs.ErofsImage(toc)
    (z,) = [n for n in image.nodes if n.entry.path == "z"]
    assert z.nlink == 2
    assert sorted(name for name, _ in image.nodes[0].children) == [b"a", b"z"]


@pytest.mark.parametrize("entry, message", [
    (TocEntry(path="f", type=EntryType.REG, size=1, xattrs={"weird.name": b"x"}), "no EROFS name index"),
    (TocEntry(path="a", type=EntryType.HARDLINK, link="missing"), "missing entry"),
    (TocEntry(path="l", type=EntryType.SYMLINK, link="x" * 5000), "symlink target"),
    (TocEntry(path="f", type=EntryType.REG, size=1, xattrs={"user.big": b"x" * 5000}), "exceeds a block"),
])
def test_what_erofs_cannot_say_is_a_format_error(entry, message):
    with pytest.raises(FormatError, match=message):
        erofs.build(_toc(entry))


@pytest.mark.parametrize("paths", [["a", "a/.."], ["a", "a/."], ["a", "a/b\0c"]])
def test_hostile_names_are_a_format_error(paths):
    toc = _toc(*(TocEntry(path=p, type=EntryType.DIR if i == 0 else EntryType.REG, size=1)
                 for i, p in enumerate(paths)))
    with pytest.raises(FormatError, match="once"):
        erofs.build(toc)


def test_unreachable_entries_are_left_out_like_the_fuse_view():
    toc = _toc(TocEntry(path="nodir/f", type=EntryType.REG, size=3))
    image = erofs.ErofsImage(toc)
    assert [n.entry.path for n in image.nodes] == [""]


def test_a_decoded_toc_gives_the_same_extents_from_its_columns():
    toc = _toc(TocEntry(path="a", type=EntryType.REG, size=5),
               TocEntry(path="b", type=EntryType.HARDLINK, link="a"),
               TocEntry(path="c", type=EntryType.REG, size=0),
               TocEntry(path="d", type=EntryType.DIR),
               TocEntry(path="d/e", type=EntryType.REG, size=9000))
    decoded = toc_codec.decode(toc_codec.encode(toc))
    assert decoded.data_files() == ([1, 5], [5, 9000])
    assert erofs.blob_extents(decoded) == erofs.blob_extents(toc) == [(1, 0, 5), (5, 1, 9000)]
    assert erofs.build(decoded)[0] == erofs.build(toc)[0]


def test_check_image_accepts_its_own_image_and_rejects_another_layers_or_a_damaged_one():
    digest = "sha256:" + "ab" * 32
    image = erofs.build(_files([10, 5000, 0]), digest)[0]
    erofs.check_image(image, digest)
    with pytest.raises(FormatError, match="another layer"):
        erofs.check_image(image, "sha256:" + "cd" * 32)
    with pytest.raises(FormatError, match="blocks"):
        erofs.check_image(image[:-erofs.BLOCK], digest)  # truncated
    with pytest.raises(FormatError, match="whole number"):
        erofs.check_image(image[:100], digest)
    bad = bytearray(image)
    bad[erofs.SUPER_OFFSET:erofs.SUPER_OFFSET + 4] = b"\0\0\0\0"
    with pytest.raises(FormatError, match="not an EROFS"):
        erofs.check_image(bytes(bad), digest)
    slot = bytearray(image)
    slot[erofs.SLOT_OFFSET:erofs.SLOT_OFFSET + 64] = ("cd" * 32).encode()
    with pytest.raises(FormatError, match="another layer's blob"):
        erofs.check_image(bytes(slot), digest)
    assert erofs.IMAGE_MEDIA_TYPE.endswith(f".v{erofs.IMAGE_VERSION}+zstd")


def test_packed_images_round_trip_and_hostile_frames_are_refused():
    image = erofs.build(_files([10, 5000, 0]), "sha256:" + "ab" * 32)[0]
    packed = erofs.pack_image(image)
    assert len(packed) < len(image) and erofs.unpack_image(packed) == image
    for bad in (b"", b"garbage", packed[:-3], erofs.pack_image(b"")):
        with pytest.raises(FormatError):
            erofs.unpack_image(bad)
    with pytest.raises(FormatError, match="limit"):
        erofs.unpack_image(erofs.pack_image(bytes(erofs.MAX_IMAGE_BYTES + 1)))


# -- small files inline (published images) -------------------------------------------------------

def _inode_at(img: bytes, node) -> tuple[int, int]:
    """(data layout, i_size) of a node's inode record in the image."""
    fmt, _, _, _, size = struct.unpack_from("<HHHHQ", img, node.offset)
    return (fmt >> 1) & 0x7, size


def test_inline_files_are_flat_inline_with_their_bytes_after_the_inode():
    toc = _toc(TocEntry(path="passwd", type=EntryType.REG, size=5),
               TocEntry(path="big", type=EntryType.REG, size=5000),
               TocEntry(path="wrong", type=EntryType.REG, size=3))
    inline = {toc.index("passwd"): b"root\n", toc.index("wrong"): b"too long"}  # not its size: ignored
    image = erofs.ErofsImage(toc, "sha256:" + "0" * 64, inline)
    img = image.encode()
    by = {n.entry.path: n for n in image.nodes}
    assert _inode_at(img, by["passwd"]) == (erofs.FLAT_INLINE, 5)
    at = by["passwd"].offset + erofs.INODE_SIZE
    assert img[at:at + 5] == b"root\n"
    assert _inode_at(img, by["big"]) == (erofs.CHUNK_BASED, 5000)
    assert _inode_at(img, by["wrong"]) == (erofs.CHUNK_BASED, 3)
    erofs.check_image(img, "sha256:" + "0" * 64)  # same features and header as an image without
    # the blob keeps every file's extent: both sides map reads with the same function
    assert image.blob_blocks == erofs.ErofsImage(toc, "sha256:" + "0" * 64).blob_blocks


def test_an_inline_record_over_one_block_keeps_the_file_in_the_blob():
    xattrs = {"user.big": b"v" * 2000}
    toc = _toc(TocEntry(path="f", type=EntryType.REG, size=2048, xattrs=xattrs))
    image = erofs.ErofsImage(toc, "", {1: b"x" * 2048})
    assert image.nodes[1].layout == erofs.CHUNK_BASED


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 3 * 4096), min_size=1, max_size=40))
def test_inline_records_never_cross_a_block(sizes):
    toc = _files(sizes)
    inline = {p: b"z" * toc.at(p).size for p in erofs.inline_candidates(toc)}
    image = erofs.ErofsImage(toc, "", inline)
    image.encode()
    for n in image.nodes:
        if n.layout == erofs.FLAT_INLINE:
            end = n.offset + erofs.INODE_SIZE + len(n.xattrs) + len(n.data)
            assert n.offset // erofs.BLOCK == (end - 1) // erofs.BLOCK


def test_inline_candidates_are_small_files_owning_their_data():
    toc = _toc(TocEntry(path="a", type=EntryType.REG, size=10),
               TocEntry(path="b", type=EntryType.REG, size=0),
               TocEntry(path="c", type=EntryType.HARDLINK, link="a"),
               TocEntry(path="d", type=EntryType.REG, size=erofs.INLINE_FILE_MAX),
               TocEntry(path="e", type=EntryType.REG, size=erofs.INLINE_FILE_MAX + 1))
    assert erofs.inline_candidates(toc) == [1, 4]
    assert erofs.inline_candidates(toc, 9) == []
