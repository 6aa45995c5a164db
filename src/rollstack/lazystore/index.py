"""`LayerIndex`: one layer's TOC as an inode table (pure: no FUSE, no I/O).

Every entry of a layer gets one stable inode, `base + position in the TOC` (the TOC is sorted
by path, so lookups are a bisect and need no table built up front; entries are materialised
lazily by the `Toc`). A layer without an explicit root entry gets a synthetic one at `base`.
Hardlinks are resolved to their target's inode, so all names of a file share one inode (and
one page cache); the target's `st_nlink` counts them. Children lists and directory link counts
are computed per directory on first use and kept (layers are immutable).
"""

from __future__ import annotations

import bisect
import stat
from typing import Iterator

from rollstack.format.toc import Chunk, EntryType, Toc, TocEntry

_TYPE_BITS = {
    EntryType.REG: stat.S_IFREG,
    EntryType.DIR: stat.S_IFDIR,
    EntryType.SYMLINK: stat.S_IFLNK,
    EntryType.CHAR: stat.S_IFCHR,
    EntryType.BLOCK: stat.S_IFBLK,
    EntryType.FIFO: stat.S_IFIFO,
    EntryType.WHITEOUT: stat.S_IFCHR,  # overlayfs whiteout: a 0/0 character device
}


class LayerIndex:
    def __init__(self, digest: str, toc: Toc, base: int) -> None:
        self.digest = digest
        self.hex = digest.partition(":")[2]
        self.toc = toc
        self.base = base
        self.paths = toc.paths
        self._shift = 0 if self.paths and self.paths[0] == "" else 1  # 1: synthetic root at base
        self.size = len(self.paths) + self._shift  # inodes used: [base, base + size)
        self._root = TocEntry(path="", type=EntryType.DIR, mode=0o755) if self._shift else None
        self._children: dict[int, list[tuple[str, int]]] = {}
        self._dir_links: dict[int, int] = {}
        self._hardlinks: dict[int, int] | None = None  # target inode -> extra names
        self._xattr_inodes: frozenset[int] | None = None  # inodes with xattrs (or opaque), once scanned

    # -- inode <-> path --------------------------------------------------------------------
    @property
    def root(self) -> int:
        return self.base

    def owns(self, ino: int) -> bool:
        return self.base <= ino < self.base + self.size

    def find(self, path: str) -> int | None:
        """The inode of `path` (hardlinks resolved), or None."""
        if path == "":
            return self.base
        i = bisect.bisect_left(self.paths, path)
        if i >= len(self.paths) or self.paths[i] != path:
            return None
        ino = self.base + i + self._shift
        e = self.toc._at(i)  # noqa: SLF001 - lazily materialised entry
        if e.type is EntryType.HARDLINK:
            return self.find(e.link) if e.link != path else None
        return ino

    def inode_at(self, pos: int) -> int:
        """The inode of TOC position `pos` (not resolving hardlinks)."""
        return self.base + self._shift + pos

    def entry(self, ino: int) -> TocEntry:
        i = ino - self.base - self._shift
        if i < 0:
            assert self._root is not None
            return self._root
        return self.toc._at(i)  # noqa: SLF001

    def path(self, ino: int) -> str:
        i = ino - self.base - self._shift
        return "" if i < 0 else self.paths[i]

    def parent(self, ino: int) -> int:
        p = self.path(ino)
        if not p:
            return self.base
        parent = p.rsplit("/", 1)[0] if "/" in p else ""
        return self.find(parent) or self.base

    def child(self, dir_ino: int, name: str) -> int | None:
        p = self.path(dir_ino)
        return self.find(f"{p}/{name}" if p else name)

    # -- directories -----------------------------------------------------------------------
    def children(self, dir_ino: int) -> list[tuple[str, int]]:
        """(name, inode) of the direct children, in name order (hardlinks resolved)."""
        got = self._children.get(dir_ino)
        if got is not None:
            return got
        p = self.path(dir_ino)
        prefix = p + "/" if p else ""
        if p:
            lo = bisect.bisect_left(self.paths, prefix)
            hi = bisect.bisect_left(self.paths, p + "0")  # '0' sorts right after '/'
        else:
            lo, hi = (1 if self._shift == 0 else 0), len(self.paths)
        out: list[tuple[str, int]] = []
        n = len(prefix)
        for i in range(lo, hi):
            rest = self.paths[i][n:]
            if rest and "/" not in rest:
                ino = self.find(self.paths[i])
                if ino is not None:
                    out.append((rest, ino))
        self._children[dir_ino] = out
        return out

    def nlink(self, ino: int) -> int:
        e = self.entry(ino)
        if e.type is EntryType.DIR:
            n = self._dir_links.get(ino)
            if n is None:
                n = 2 + sum(1 for _, c in self.children(ino) if self.entry(c).type is EntryType.DIR)
                self._dir_links[ino] = n
            return n
        if self._hardlinks is None:  # big layer still being indexed off-loop: never block a getattr
            return 1
        return 1 + self._hardlinks.get(ino, 0)

    def hardlinks(self) -> dict[int, int]:
        """Target inode -> number of extra names. Scans every entry once (call off-loop early)."""
        if self._hardlinks is None:
            counts: dict[int, int] = {}
            for e in self.toc.entries:  # bulk materialisation: ~3 us an entry
                if e.type is EntryType.HARDLINK:
                    t = self.find(e.link)
                    if t is not None:
                        counts[t] = counts.get(t, 0) + 1
            self._hardlinks = counts
        return self._hardlinks

    @property
    def xattr_inodes(self) -> frozenset[int]:
        """Inodes that have extended attributes (TOC xattrs, or the opaque marker); every other
        inode of the layer has none. From the TOC's record column (`Toc.xattr_indices`): known
        as soon as the layer is added, so the fast xattr path serves a cold start too."""
        if self._xattr_inodes is None:
            first = self.base + self._shift
            self._xattr_inodes = frozenset(first + i for i in self.toc.xattr_indices())
        return self._xattr_inodes

    @property
    def hardlinks_ready(self) -> bool:
        return self._hardlinks is not None

    def _scope(self, ino: int, same_dir: bool) -> str | None:
        """The path prefix neighbours must keep (the entry's parent directory subtree), or None."""
        if not same_dir:
            return None
        i = ino - self.base - self._shift
        if i < 0:
            return None
        parent = self.paths[i].rpartition("/")[0]
        return parent + "/" if parent else None

    def chunks_after(self, ino: int, chunk_offset: int, same_dir: bool = False) -> Iterator[Chunk]:
        """Chunks stored after the chunk at file offset `chunk_offset` of entry `ino`, in blob
        order (the writer stores payloads in TOC order), materialising entries only as consumed.
        `same_dir`: stop at the first entry outside the entry's parent directory subtree (paths
        are sorted, so a subtree is contiguous)."""
        e = self.entry(ino)
        for c in e.chunks:
            if c.offset > chunk_offset:
                yield c
        prefix = self._scope(ino, same_dir)
        paths = self.paths
        i = ino - self.base - self._shift + 1
        n = len(paths)
        while i < n:
            if prefix is not None and not paths[i].startswith(prefix):
                return
            yield from self.toc._at(i).chunks  # noqa: SLF001
            i += 1

    def sibling_chunks(self, ino: int, file_max: int) -> list[Chunk]:
        """Chunks of the regular files beside `ino` in its directory (`ino` left out, each file
        at most `file_max` stored bytes), in blob order (= name order)."""
        out: list[Chunk] = []
        for _, child in self.children(self.parent(ino)):
            e = self.entry(child)
            if child != ino and e.type is EntryType.REG and e.chunks and sum(c.blob_size for c in e.chunks) <= file_max:
                out.extend(e.chunks)
        return out

    def chunks_before(self, ino: int, same_dir: bool = False) -> Iterator[Chunk]:
        """Chunks of the entries before `ino`, in reverse blob order, materialised as consumed."""
        prefix = self._scope(ino, same_dir)
        paths = self.paths
        i = ino - self.base - self._shift - 1
        while i >= 0:
            if prefix is not None and not paths[i].startswith(prefix):
                return
            yield from reversed(self.toc._at(i).chunks)  # noqa: SLF001
            i -= 1


def mode_bits(e: TocEntry) -> int:
    """`st_mode` of an entry (type bits + permissions)."""
    if e.type is EntryType.WHITEOUT:
        return stat.S_IFCHR  # mode 0, like overlayfs' own whiteouts
    return _TYPE_BITS[e.type] | (e.mode & 0o7777)


def rdev(e: TocEntry) -> int:
    import os

    if e.type in (EntryType.CHAR, EntryType.BLOCK):
        return os.makedev(e.rdev_major, e.rdev_minor)
    return 0


def entry_size(e: TocEntry) -> int:
    if e.type is EntryType.REG:
        return e.size
    if e.type is EntryType.SYMLINK:
        return len(e.link.encode("utf-8", "surrogateescape"))
    if e.type is EntryType.DIR:
        return 4096
    return 0
