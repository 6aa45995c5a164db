"""A layer's TOC as an EROFS metadata image over a block-aligned data blob (pure: bytes in, bytes out).

Why: overlayfs on FUSE lowers pays a daemon round trip for every lookup of a new overlay mount's
dentry and for every `trusted.overlay.*` probe (~35-40 us each here; FUSE cannot cache xattr
answers). EROFS is an in-kernel read-only filesystem: with its metadata in a small local image,
lookups, getattr, readdir, readlink and xattrs are kernel work at native speed, and only file
*data* is read from the second device, the layer's blob, which the lazy store serves as one FUSE
file (`/blobs/<hex>`, lazystore/blobs.py) fetched on first read. Linux >= 6.12 mounts such an image
straight from files (`CONFIG_EROFS_FS_BACKED_BY_FILE`, `mount -t erofs -o device=BLOB IMAGE DIR`).

The image (on-disk format: erofs-utils `include/erofs_fs.h`, which this follows):
- block 0: the superblock at 1024, one device slot (the blob) at 1152;
- from block 1: every inode as a 64-byte extended inode, 32-byte aligned, never crossing a block.
  Directories and symlinks whose data fits keep it inline after the inode (FLAT_INLINE); bigger
  ones get whole blocks after the inode area (FLAT_PLAIN). Regular files are CHUNK_BASED with one
  chunk index (the chunk size is the file's size rounded up to a power of two) naming device 1
  and the file's first block in the blob, except the small files whose bytes the builder is given
  (`inline`, at most INLINE_FILE_MAX each): those are FLAT_INLINE like a short symlink, so the
  kernel reads them from the image and never from the blob. Extended attributes (and the opaque
  marker) are inline.
- Hardlinks share one inode; a 0/0 character device stays a 0/0 character device (a whiteout).

The blob (`blob_extents`): the layer's non-empty regular files in TOC order, each starting on a
4 KiB boundary, zero padded. The lazy store computes the same extents from the same TOC to map a
blob read back onto file reads, so the two sides share this one function.

Everything the format cannot say (a name over 255 bytes, an xattr namespace EROFS has no index
for, an inode record over one block) raises `FormatError`: the caller keeps the FUSE lower.
"""

from __future__ import annotations

import bisect
import stat
import struct
import uuid
from dataclasses import dataclass, field
from typing import Mapping

from rollstack.errors import FormatError
from rollstack.format.toc import EntryType, Toc, TocEntry

BLOCK = 4096
BLOCK_BITS = 12
MAGIC = 0xE0F5E1E2
SUPER_OFFSET = 1024
SLOT_OFFSET = 1152  # devt_slotoff 9 x 128 bytes: right after the 128-byte superblock
FIRST_INODE = BLOCK  # the inode area starts at block 1 (root nid 128)
INODE_SIZE = 64  # struct erofs_inode_extended
INCOMPAT_CHUNKED_FILE = 0x4
INCOMPAT_DEVICE_TABLE = 0x8
FLAT_PLAIN, FLAT_INLINE, CHUNK_BASED = 0, 2, 4
CHUNK_INDEXES = 0x20
NULL_ADDR = 0xFFFFFFFF
INLINE_MAX = 2048  # directory/symlink data up to this size is stored after its inode
INLINE_FILE_MAX = 2048
"""Regular files up to this size are stored in a published image (`inline_candidates`): the
small files every start reads (runc's /etc/passwd and /etc/group, `__init__.py`s, dist-info
records) then cost no FUSE request and no fetch. 5.9k of python-project's 15k files, 4.9 MB."""
NAME_MAX = 255
IMAGE_VERSION = 2
"""Bump when the image layout or `blob_extents` change: an image published by another version
names other blob offsets, so a node only mounts images of its own version (`IMAGE_MEDIA_TYPE`).
v2: small files' bytes inline (v1 images named every file in the blob)."""
IMAGE_MEDIA_TYPE = f"application/vnd.rollstack.erofs.v{IMAGE_VERSION}+zstd"
"""A published image is stored zstd-compressed (`pack_image`): mostly zero padding and inode
slack, it shrinks ~6x (2.3 MB -> 0.39 MB for an 18k-entry layer) and unpacks in ~5 ms."""
MAX_IMAGE_BYTES = 256 << 20
"""An image larger than this is neither published nor unpacked (~1.3 M entries)."""

FT = {EntryType.REG: 1, EntryType.DIR: 2, EntryType.CHAR: 3, EntryType.WHITEOUT: 3,
      EntryType.BLOCK: 4, EntryType.FIFO: 5, EntryType.SYMLINK: 7}
_S_IFMT = {EntryType.REG: stat.S_IFREG, EntryType.DIR: stat.S_IFDIR, EntryType.SYMLINK: stat.S_IFLNK,
           EntryType.CHAR: stat.S_IFCHR, EntryType.WHITEOUT: stat.S_IFCHR, EntryType.BLOCK: stat.S_IFBLK,
           EntryType.FIFO: stat.S_IFIFO}
# xattr name prefixes EROFS has a short index for (erofs_fs.h EROFS_XATTR_INDEX_*)
_XATTR_INDEX = (("user.", 1), ("trusted.", 4), ("security.", 6), ("lustre.", 5))
_ACL_INDEX = {"system.posix_acl_access": 2, "system.posix_acl_default": 3}
OPAQUE = "trusted.overlay.opaque"

_SUPER = struct.Struct("<IIIBBHQQIIII16s16sIHHHBBIQBB2sIQQ")
_SLOT = struct.Struct("<64sIIHH52s")
_INODE = struct.Struct("<HHHHQIIIIQII16s")
_DIRENT = struct.Struct("<QHBB")
_CHUNK_INDEX = struct.Struct("<HHI")
assert _SUPER.size == 128 and _SLOT.size == 128 and _INODE.size == INODE_SIZE and _DIRENT.size == 12


def _blocks(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK


def inline_candidates(toc: Toc, limit: int = INLINE_FILE_MAX) -> list[int]:
    """TOC positions of the regular files (owning their data) small enough to inline, in TOC order."""
    positions, sizes = toc.data_files()
    return [p for p, size in zip(positions, sizes) if size <= limit]


def blob_extents(toc: Toc) -> list[tuple[int, int, int]]:
    """(TOC position, first blob block, size) of each non-empty regular file that owns its data
    (not a hardlink), in blob order (TOC order; `Toc.data_files`)."""
    positions, sizes = toc.data_files()
    out, block = [], 0
    for i, size in zip(positions, sizes):
        out.append((i, block, size))
        block += (size + BLOCK - 1) // BLOCK
    return out


@dataclass(frozen=True)
class BlobMap:
    """`blob_extents` indexed for reads: which files a byte range of the blob covers."""

    positions: list[int]
    starts: list[int]  # byte offsets
    sizes: list[int]
    size: int  # the blob's size in bytes (block aligned)

    @classmethod
    def of(cls, toc: Toc) -> "BlobMap":
        """From the TOC's record columns, vectorised (~2 ms for 60k entries: the lazy store
        computes it on its loop's worker thread while environments start)."""
        import numpy as np

        positions, sizes = toc.data_files()
        if not positions:
            return cls([], [], [], 0)
        blocks = (np.asarray(sizes, dtype=np.int64) + BLOCK - 1) // BLOCK
        ends = np.cumsum(blocks)
        starts = (ends - blocks) * BLOCK
        return cls(list(positions), starts.tolist(), list(sizes), int(ends[-1]) * BLOCK)

    def pieces(self, off: int, size: int) -> list[tuple[int, int, int, int]]:
        """(TOC position or -1 for zero padding, offset in the file, length, offset in the reply)
        covering blob bytes [off, off + size) clipped to the blob."""
        end = min(self.size, off + max(0, size))
        out: list[tuple[int, int, int, int]] = []
        pos = off
        k = max(0, bisect.bisect_right(self.starts, off) - 1)
        while pos < end and k < len(self.starts):
            start, fsize = self.starts[k], self.sizes[k]
            if pos < start:  # never: extents are contiguous up to padding; kept for safety
                out.append((-1, 0, start - pos, pos - off))
                pos = start
            file_end = start + fsize
            padded_end = start + _blocks(fsize) * BLOCK
            if pos < file_end:
                n = min(end, file_end) - pos
                out.append((self.positions[k], pos - start, n, pos - off))
                pos += n
            if pos < end and pos < padded_end:
                n = min(end, padded_end) - pos
                out.append((-1, 0, n, pos - off))
                pos += n
            k += 1
        return out


@dataclass(slots=True)
class _Node:
    entry: TocEntry
    ino: int
    children: list[tuple[bytes, int]] = field(default_factory=list)  # (name, node index)
    parent: int = 0
    pos: int = -1  # TOC position (-1: a synthetic root)
    nlink: int = 1
    xattrs: bytes = b""
    data: bytes = b""  # directory/symlink/inline file payload (directory: dirent blocks, nids later)
    layout: int = FLAT_PLAIN
    offset: int = 0  # of the inode record in the image
    data_block: int = NULL_ADDR
    blob_block: int = NULL_ADDR


def _xattr_body(e: TocEntry) -> bytes:
    items = dict(e.xattrs)
    if e.type is EntryType.DIR and e.opaque:
        items[OPAQUE] = b"y"
    if not items:
        return b""
    out = bytearray(12)  # erofs_xattr_ibody_header: no name filter, no shared xattrs
    for name, value in sorted(items.items()):
        if name in _ACL_INDEX:
            index, suffix = _ACL_INDEX[name], b""
        else:
            for prefix, index in _XATTR_INDEX:
                if name.startswith(prefix):
                    suffix = name[len(prefix):].encode("utf-8", "surrogateescape")
                    break
            else:
                raise FormatError(f"{e.path!r}: xattr {name!r} has no EROFS name index")
        if len(suffix) > 255 or len(value) > 0xFFFF:
            raise FormatError(f"{e.path!r}: xattr {name!r} too large for EROFS")
        out += struct.pack("<BBH", len(suffix), index, len(value)) + suffix + value
        out += b"\0" * (-len(out) % 4)
    return bytes(out)


def _dir_blocks(names: list[tuple[bytes, int, int]]) -> list[list[tuple[bytes, int, int]]]:
    """Sorted (name, nid, file type) split into directory blocks (dirents, then names)."""
    blocks: list[list[tuple[bytes, int, int]]] = [[]]
    used = 0
    for item in names:
        need = _DIRENT.size + len(item[0])
        if blocks[-1] and used + need > BLOCK:
            blocks.append([])
            used = 0
        blocks[-1].append(item)
        used += need
    return blocks


def _dir_size(blocks: list[list[tuple[bytes, int, int]]]) -> int:
    last = blocks[-1]
    return BLOCK * (len(blocks) - 1) + sum(_DIRENT.size + len(n) for n, _, _ in last)


def _encode_dir(blocks: list[list[tuple[bytes, int, int]]]) -> bytes:
    out = bytearray()
    for i, block in enumerate(blocks):
        head = bytearray()
        names = bytearray()
        nameoff = _DIRENT.size * len(block)
        for name, nid, ft in block:
            head += _DIRENT.pack(nid, nameoff + len(names), ft, 0)
            names += name
        data = head + names
        if i < len(blocks) - 1:
            data += b"\0" * (BLOCK - len(data))
        out += data
    return bytes(out)


class ErofsImage:
    """Build with `ErofsImage(toc, blob_tag).encode()`; `nodes` and `blob_blocks` for inspection.

    `inline`: TOC position -> the bytes of that regular file, stored in the image instead of read
    from the blob (ignored unless exactly the file's size and the inode record fits one block)."""

    def __init__(self, toc: Toc, blob_tag: str = "", inline: Mapping[int, bytes] | None = None) -> None:
        self.toc = toc
        self.tag = (blob_tag.partition(":")[2] or blob_tag).encode()[:64]  # a digest: its 64 hex digits
        self.inline = inline or {}
        self.nodes: list[_Node] = []
        self.blob_blocks = 0
        self._build()

    # -- the tree ----------------------------------------------------------------------------
    def _build(self) -> None:
        toc = self.toc
        entries = toc.entries
        paths = toc.paths
        has_root = bool(paths) and paths[0] == ""
        root_entry = entries[0] if has_root else TocEntry(path="", type=EntryType.DIR, mode=0o755)
        if root_entry.type is not EntryType.DIR:
            raise FormatError("the layer's root is not a directory")
        node_of: dict[int, int] = {}  # TOC position (-1: synthetic root) -> node index
        self.nodes.append(_Node(root_entry, 1, pos=0 if has_root else -1))
        node_of[0 if has_root else -1] = 0
        pos_of = {p: i for i, p in enumerate(paths)}
        links: list[tuple[int, bytes, TocEntry]] = []
        nodes, DIR = self.nodes, EntryType.DIR
        for i, (path, e) in enumerate(zip(paths, entries)):
            if path == "":
                continue
            parent_path, _, name_s = path.rpartition("/")
            parent = 0 if parent_path == "" else node_of.get(pos_of.get(parent_path, -2))
            if parent is None or nodes[parent].entry.type is not DIR:
                continue  # unreachable (no parent directory entry): the FUSE view hides it too
            name = name_s.encode("utf-8", "surrogateescape")
            if len(name) > NAME_MAX or not name:
                raise FormatError(f"{e.path!r}: name longer than {NAME_MAX} bytes")
            if name in (b".", b"..") or b"\0" in name or (i and paths[i - 1] == path):
                raise FormatError(f"{e.path!r}: not a name a directory can hold once")
            if e.type is EntryType.HARDLINK:
                links.append((parent, name, e))  # after every target has its node
                continue
            if e.type not in FT:
                raise FormatError(f"{e.path!r}: entry type {e.type.value} has no EROFS form")
            node_of[i] = len(self.nodes)
            self.nodes.append(_Node(e, len(self.nodes) + 1, parent=parent, pos=i))
            self.nodes[parent].children.append((name, node_of[i]))
        for parent, name, e in links:
            t = pos_of.get(e.link)
            target = node_of.get(t) if t is not None else None
            if target is None or self.nodes[target].entry.type is EntryType.DIR:
                raise FormatError(f"hardlink {e.path!r} points to missing entry {e.link!r}")
            self.nodes[target].nlink += 1
            self.nodes[parent].children.append((name, target))
        for n in self.nodes:
            if n.entry.type is EntryType.DIR:
                n.nlink = 2 + sum(1 for _, c in n.children if self.nodes[c].entry.type is EntryType.DIR)
        self._layout()

    def _layout(self) -> None:
        # 1. payload sizes, then inode records, then data blocks (nids must be known before dirents)
        dir_items: dict[int, list[tuple[bytes, int]]] = {}
        for k, n in enumerate(self.nodes):
            n.xattrs = _xattr_body(n.entry)
            t = n.entry.type
            if t is EntryType.DIR:
                items = sorted([(b".", k), (b"..", n.parent), *n.children])
                dir_items[k] = items
                n.data = b"\0" * _dir_size(_dir_blocks([(nm, 0, 0) for nm, _ in items]))
            elif t is EntryType.SYMLINK:
                n.data = n.entry.link.encode("utf-8", "surrogateescape")
                if len(n.data) >= BLOCK:
                    raise FormatError(f"{n.entry.path!r}: symlink target over {BLOCK - 1} bytes")
        off = FIRST_INODE
        for n in self.nodes:
            extra = 0
            if n.entry.type is EntryType.REG and n.entry.size > 0:
                data = self.inline.get(n.pos)
                if data is not None and len(data) == n.entry.size and INODE_SIZE + len(n.xattrs) + len(data) <= BLOCK:
                    n.data, n.layout, extra = data, FLAT_INLINE, len(data)
                else:
                    n.layout = CHUNK_BASED
                    extra = (-(INODE_SIZE + len(n.xattrs)) % 8) + _CHUNK_INDEX.size
            elif n.data and len(n.data) <= INLINE_MAX:
                n.layout = FLAT_INLINE
                extra = len(n.data)
            record = INODE_SIZE + len(n.xattrs) + extra
            if record > BLOCK:
                raise FormatError(f"{n.entry.path!r}: inode record of {record} bytes exceeds a block")
            if off % BLOCK + record > BLOCK:
                off += -off % BLOCK
            n.offset = off
            off += record + (-record % 32)
        block = _blocks(off)
        for n in self.nodes:
            if n.data and n.layout == FLAT_PLAIN:
                n.data_block = block
                block += _blocks(len(n.data))
        self.meta_blocks = block
        # 2. directory payloads with real nids
        for k, items in dir_items.items():
            n = self.nodes[k]
            named = [(nm, self.nodes[c].offset // 32, FT[self.nodes[c].entry.type]) for nm, c in items]
            n.data = _encode_dir(_dir_blocks(named))
        # 3. the blob
        ext = blob_extents(self.toc)
        where = {p: b for p, b, _ in ext}
        for n in self.nodes:
            if n.layout == CHUNK_BASED:
                n.blob_block = where[n.pos]
        self.blob_blocks = ext[-1][1] + _blocks(ext[-1][2]) if ext else 0

    # -- bytes -------------------------------------------------------------------------------
    def encode(self) -> bytes:
        img = bytearray(self.meta_blocks * BLOCK)
        root = self.nodes[0].offset // 32
        if root > 0xFFFF:
            raise FormatError("root nid over 16 bits")
        sb = _SUPER.pack(MAGIC, 0, 0, BLOCK_BITS, 0, root, len(self.nodes), 0, 0, self.meta_blocks, 0, 0,
                         uuid.uuid5(uuid.NAMESPACE_OID, self.tag.decode() or "rollstack").bytes,
                         b"rollstack".ljust(16, b"\0"), INCOMPAT_CHUNKED_FILE | INCOMPAT_DEVICE_TABLE,
                         0, 1, SLOT_OFFSET // 128, 0, 0, 0, 0, 0, 0, b"\0\0", 0, 0, 0)
        img[SUPER_OFFSET:SUPER_OFFSET + 128] = sb
        img[SLOT_OFFSET:SLOT_OFFSET + 128] = _SLOT.pack(self.tag.ljust(64, b"\0"), self.blob_blocks & 0xFFFFFFFF, 0,
                                                        self.blob_blocks >> 32, 0, b"\0" * 52)
        for n in self.nodes:
            self._put_inode(img, n)
        return bytes(img)

    def _put_inode(self, img: bytearray, n: _Node) -> None:
        e = n.entry
        t = e.type
        mode = _S_IFMT[t] | (0 if t is EntryType.WHITEOUT else e.mode & 0o7777)
        size, iu = 0, NULL_ADDR
        tail = b""
        if t is EntryType.REG:
            size = e.size
            if n.layout == FLAT_INLINE:
                tail = n.data
            elif n.layout == CHUNK_BASED:
                chunkbits = max(0, (_blocks(size) - 1).bit_length())
                iu = chunkbits | CHUNK_INDEXES  # erofs_inode_chunk_info.format (low 16 bits)
                pad = -(INODE_SIZE + len(n.xattrs)) % 8
                tail = b"\0" * pad + _CHUNK_INDEX.pack(0, 1, n.blob_block)
        elif t in (EntryType.DIR, EntryType.SYMLINK):
            size = len(n.data)
            if n.layout == FLAT_INLINE:
                tail = n.data
            else:
                iu = n.data_block
                img[n.data_block * BLOCK:n.data_block * BLOCK + len(n.data)] = n.data
        elif t in (EntryType.CHAR, EntryType.BLOCK):
            iu = _new_encode_dev(e.rdev_major, e.rdev_minor)
        elif t is EntryType.WHITEOUT:
            iu = 0
        else:
            iu = 0
        icount = 0 if not n.xattrs else 1 + (len(n.xattrs) - 12) // 4
        fmt = 1 | (n.layout << 1)
        sec, nsec = divmod(e.mtime_ns, 1_000_000_000)
        record = _INODE.pack(fmt, icount, mode, 0, size, iu, n.ino & 0xFFFFFFFF, e.uid, e.gid, max(sec, 0), nsec,
                             n.nlink, b"\0" * 16) + n.xattrs + tail
        img[n.offset:n.offset + len(record)] = record


def _new_encode_dev(major: int, minor: int) -> int:
    """Linux `new_encode_dev`: the 32-bit device number EROFS stores."""
    return (minor & 0xFF) | (major << 8) | ((minor & ~0xFF) << 12)


def build(toc: Toc, blob_tag: str = "", inline: Mapping[int, bytes] | None = None) -> tuple[bytes, int]:
    """(metadata image, blob size in bytes) for a layer's TOC; `inline` as for `ErofsImage`."""
    image = ErofsImage(toc, blob_tag, inline)
    return image.encode(), image.blob_blocks * BLOCK


def check_image(data: bytes, blob_tag: str) -> None:
    """FormatError unless `data` looks like the image `build(toc, blob_tag)` makes: EROFS magic,
    4 KiB blocks, the chunked-file and device-table features only, one device slot tagged with
    the layer's digest and the uuid derived from it, and a size of `meta_blocks` blocks.

    For an image fetched from a store (published beside a group, its digest named by the group
    manifest): it catches an image of another layer, of another format version, or a truncated
    one, before the kernel mounts it."""
    tag = (blob_tag.partition(":")[2] or blob_tag).encode()[:64]
    if len(data) < 2 * BLOCK or len(data) % BLOCK:
        raise FormatError(f"EROFS image of {len(data)} bytes is not a whole number of blocks (>= 2)")
    sb = _SUPER.unpack_from(data, SUPER_OFFSET)
    magic, blkszbits, meta_blocks, uid, incompat = sb[0], sb[3], sb[9], sb[12], sb[14]
    extra_devices, devt_slotoff = sb[16], sb[17]
    if magic != MAGIC or blkszbits != BLOCK_BITS:
        raise FormatError("not an EROFS image with 4 KiB blocks")
    if incompat != INCOMPAT_CHUNKED_FILE | INCOMPAT_DEVICE_TABLE or extra_devices != 1 or devt_slotoff != SLOT_OFFSET // 128:
        raise FormatError("EROFS image: unexpected features or device table")
    if meta_blocks * BLOCK != len(data):
        raise FormatError(f"EROFS image: {meta_blocks} blocks in the superblock, {len(data) // BLOCK} in the file")
    if uid != uuid.uuid5(uuid.NAMESPACE_OID, tag.decode() or "rollstack").bytes:
        raise FormatError("EROFS image: built for another layer (uuid)")
    slot_tag = _SLOT.unpack_from(data, SLOT_OFFSET)[0].rstrip(b"\0")
    if slot_tag != tag:
        raise FormatError("EROFS image: its device is another layer's blob")


def pack_image(image: bytes) -> bytes:
    """The stored form of a published image: one zstd frame with its content size."""
    import zstandard

    return zstandard.ZstdCompressor(level=3, write_content_size=True).compress(image)


def unpack_image(data: bytes) -> bytes:
    """`pack_image`'s input again, or FormatError (not one zstd frame, or over
    MAX_IMAGE_BYTES once unpacked: a published blob is untrusted until `check_image`)."""
    import zstandard

    try:
        size = zstandard.get_frame_parameters(data).content_size
        if not 0 < size <= MAX_IMAGE_BYTES:
            raise FormatError(f"EROFS image claims {size} bytes unpacked (limit {MAX_IMAGE_BYTES})")
        image = zstandard.ZstdDecompressor().decompress(data, max_output_size=MAX_IMAGE_BYTES)
    except zstandard.ZstdError as exc:
        raise FormatError(f"EROFS image is not a valid zstd frame: {exc}") from None
    if len(image) != size:
        raise FormatError(f"EROFS image unpacks to {len(image)} bytes, its frame says {size}")
    return image
