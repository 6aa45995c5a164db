"""The table of contents of a rollstack layer: what every entry is, where its bytes live.

Pure data: no I/O. `format.toc_codec.encode()`/`decode()` are the only serialisation (see docs/format.md).
Paths are relative, normalised, '/'-separated, without a leading '/' ("" is the layer root).
"""

from __future__ import annotations

import bisect
import enum
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator


class EntryType(str, enum.Enum):
    REG = "reg"
    DIR = "dir"
    SYMLINK = "symlink"
    HARDLINK = "hardlink"  # `link` names the target path inside the same layer
    CHAR = "char"
    BLOCK = "block"
    FIFO = "fifo"
    WHITEOUT = "whiteout"  # deletes `path` from the layers below (OCI `.wh.NAME`)


class Compression(str, enum.Enum):
    NONE = "none"
    ZSTD = "zstd"


@dataclass(frozen=True, slots=True)
class Chunk:
    """One independently fetchable, decompressible and verifiable piece of a file's payload."""

    offset: int  # offset inside the file (uncompressed)
    size: int  # uncompressed size
    blob_offset: int  # where the stored (maybe compressed) bytes start in the blob
    blob_size: int  # stored size in the blob
    digest: str  # "sha256:<hex>" of the *uncompressed* bytes
    compression: Compression = Compression.ZSTD


@dataclass(slots=True)
class TocEntry:
    path: str
    type: EntryType
    mode: int = 0o644  # permission bits incl. setuid/setgid/sticky (no S_IFMT bits)
    uid: int = 0
    gid: int = 0
    mtime_ns: int = 0
    size: int = 0  # regular files: payload size
    link: str = ""  # symlink target, or hardlink target path
    rdev_major: int = 0
    rdev_minor: int = 0
    xattrs: dict[str, bytes] = field(default_factory=dict)
    opaque: bool = False  # directories: hides everything below (OCI `.wh..wh..opq`)
    chunks: list[Chunk] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def parent(self) -> str:
        return self.path.rsplit("/", 1)[0] if "/" in self.path else ""


TOC_ZSTD_LEVEL = 9  # TOCs are written once, read by every node: spend a bit more CPU on them


class Toc:
    """All entries of one layer, sorted by path (code-point order, so a directory's subtree is
    one contiguous run right after it). Decoded TOCs materialise `TocEntry` objects lazily:
    opening a 50k-entry layer costs one decompress and one split, not 50k object constructions.
    """

    __slots__ = ("_paths", "_entries", "_load", "_load_all", "_index", "_scan_xattrs", "_scan_files")

    def __init__(self, entries: Iterable[TocEntry] = ()) -> None:
        ents = sorted(entries, key=_path_key)
        for prev, cur in zip(ents, ents[1:]):
            if prev.path == cur.path:
                raise ValueError(f"duplicate TOC entry {cur.path!r}")
        self._paths: list[str] = [e.path for e in ents]
        self._entries: list[TocEntry | None] = list(ents)
        self._load: Callable[[int], TocEntry] | None = None
        self._load_all: Callable[[], list[TocEntry]] | None = None
        self._index: dict[str, int] | None = None
        self._scan_xattrs: Callable[[], list[int]] | None = None
        self._scan_files: Callable[[], tuple[list[int], list[int]]] | None = None

    @classmethod
    def _lazy(cls, paths: list[str], load: Callable[[int], TocEntry],
              load_all: Callable[[], list[TocEntry]] | None = None,
              scan_xattrs: Callable[[], list[int]] | None = None,
              scan_files: "Callable[[], tuple[list[int], list[int]]] | None" = None) -> "Toc":
        """A TOC whose entry `i` is built by `load(i)` on first use, or all at once by
        `load_all()` (used by the decoder); `scan_xattrs()` answers `xattr_indices` without
        building entries."""
        toc = cls.__new__(cls)
        toc._paths = paths
        toc._entries = [None] * len(paths)
        toc._load = load
        toc._load_all = load_all
        toc._index = None
        toc._scan_xattrs = scan_xattrs
        toc._scan_files = scan_files
        return toc

    def data_files(self) -> tuple[list[int], list[int]]:
        """(positions, sizes) of the regular files with data (size > 0; hardlinks own none), in
        order. A decoded TOC answers from its record columns without building entries."""
        if self._scan_files is not None and self._load_all is not None:
            return self._scan_files()
        pos = [i for i, e in enumerate(self.entries) if e.type is EntryType.REG and e.size > 0]
        return pos, [self._at(i).size for i in pos]

    def xattr_indices(self) -> list[int]:
        """Positions of the entries that carry xattrs or the opaque marker, in order. A decoded
        TOC answers from its record column (no entry is built: ~1 ms for 50k entries)."""
        if self._scan_xattrs is not None and self._load_all is not None:
            return self._scan_xattrs()
        return [i for i, e in enumerate(self.entries) if e.xattrs or e.opaque]

    # -- access -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._paths)

    def __iter__(self) -> Iterator[TocEntry]:
        return iter(self.entries)

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and self._find(path) >= 0

    @property
    def paths(self) -> list[str]:
        """Every path, in TOC order (do not mutate)."""
        return self._paths

    @property
    def entries(self) -> list[TocEntry]:
        """Every entry in path order (materialises all of them)."""
        if self._load_all is not None:
            bulk = self._load_all()
            self._load_all = None
            # entries already handed out stay the same objects
            self._entries = [e if e is not None else b for e, b in zip(self._entries, bulk)]
        return [self._at(i) for i in range(len(self._paths))]

    def at(self, i: int) -> TocEntry:
        """Entry number `i` in path order (built on first access)."""
        return self._at(i)

    def index(self, path: str) -> int:
        """Position of `path` in `paths`, or -1."""
        return self._find(path)

    def lookup(self, path: str) -> TocEntry | None:
        i = self._find(path)
        return self._at(i) if i >= 0 else None

    def children(self, path: str) -> list[TocEntry]:
        """Direct children of directory `path` ("" is the root), in name order."""
        lo, hi = self._subtree(path)
        depth_prefix = path + "/" if path else ""
        out = []
        for i in range(lo, hi):
            rest = self._paths[i][len(depth_prefix):]
            if rest and "/" not in rest:
                out.append(self._at(i))
        return out

    def resolve(self, entry: TocEntry) -> TocEntry:
        """The entry whose payload/metadata a hardlink shares (the entry itself otherwise)."""
        if entry.type is not EntryType.HARDLINK:
            return entry
        target = self.lookup(entry.link)
        if target is None or target.type is EntryType.HARDLINK:
            from rollstack.errors import FormatError

            raise FormatError(f"hardlink {entry.path!r} points to missing entry {entry.link!r}")
        return target

    # -- internals ----------------------------------------------------------------------
    def _at(self, i: int) -> TocEntry:
        e = self._entries[i]
        if e is None:
            assert self._load is not None
            e = self._entries[i] = self._load(i)
        return e

    def _find(self, path: str) -> int:
        if self._index is None:
            # one dict build beats bisect once a few hundred lookups happen (FUSE does many)
            self._index = {p: i for i, p in enumerate(self._paths)}
        return self._index.get(path, -1)

    def _subtree(self, path: str) -> tuple[int, int]:
        """Index range of the strict descendants of `path`."""
        if not path:
            return (1 if self._paths and self._paths[0] == "" else 0), len(self._paths)
        lo = bisect.bisect_left(self._paths, path + "/")
        hi = bisect.bisect_left(self._paths, path + "0")  # '0' == '/' + 1
        return lo, hi


def _path_key(e: TocEntry) -> str:
    return e.path
