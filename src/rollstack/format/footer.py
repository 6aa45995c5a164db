"""The fixed-size footer at the very end of every layer blob: where the TOC is and its digest.

Layout (little-endian, 96 bytes; docs/format.md "Footer"):

    0   8  magic          b"RSTKLAYR"
    8   4  version        u32 (1)
    12  4  flags          u32 (0; readers reject unknown bits)
    16  8  toc_offset     u64 blob offset of the compressed TOC
    24  8  toc_length     u64 its length in bytes
    32  8  toc_raw_length u64 its decompressed length
    40 32  toc_digest     sha256 of the compressed TOC bytes
    72 16  reserved       zero
    88  8  end magic      b"RSTKEND1"
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from rollstack.errors import FormatError

MAGIC = b"RSTKLAYR"
END_MAGIC = b"RSTKEND1"
VERSION = 1
_STRUCT = struct.Struct("<8sIIQQQ32s16s8s")
FOOTER_SIZE = _STRUCT.size
assert FOOTER_SIZE == 96


@dataclass(frozen=True, slots=True)
class Footer:
    toc_offset: int
    toc_length: int
    toc_raw_length: int
    toc_digest: str  # "sha256:<hex>"
    version: int = VERSION

    def encode(self) -> bytes:
        return _STRUCT.pack(MAGIC, self.version, 0, self.toc_offset, self.toc_length,
                            self.toc_raw_length, bytes.fromhex(self.toc_digest.removeprefix("sha256:")),
                            b"\0" * 16, END_MAGIC)

    @classmethod
    def decode(cls, data: bytes, blob_size: int | None = None) -> "Footer":
        """Parse the last FOOTER_SIZE bytes of a blob; `blob_size` enables range checks."""
        if len(data) != FOOTER_SIZE:
            raise FormatError(f"footer must be {FOOTER_SIZE} bytes, got {len(data)}")
        magic, version, flags, off, length, raw_len, digest, _, end = _STRUCT.unpack(data)
        if magic != MAGIC or end != END_MAGIC:
            raise FormatError("not a rollstack layer (bad footer magic)")
        if version != VERSION:
            raise FormatError(f"unsupported layer format version {version}")
        if flags:
            raise FormatError(f"unknown footer flags {flags:#x}")
        if blob_size is not None and off + length != blob_size - FOOTER_SIZE:
            raise FormatError(
                f"footer says the TOC spans [{off}, {off + length}) but it must end at {blob_size - FOOTER_SIZE}")
        return cls(off, length, raw_len, "sha256:" + digest.hex(), version)
