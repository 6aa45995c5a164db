"""The table of contents of a rollstack layer: what every entry is, where its bytes live.

Pure data: no I/O. `Toc.encode()`/`Toc.decode()` are the only serialisation (see docs/format.md).
Paths are relative, normalised, '/'-separated, without a leading '/' ("" is the layer root).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


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
