"""One chunk's bytes: encode (compress or keep raw) and decode (decompress + verify). Pure.

Every chunk is an independent zstd frame (or raw bytes when compression does not pay), so any
chunk can be fetched, decompressed and checked on its own, in any order, by any node.
"""

from __future__ import annotations

import hashlib

import zstandard

from rollstack.errors import IntegrityError
from rollstack.format.toc import Chunk, Compression

# Keep raw unless zstd saves at least 1/32 of the bytes: raw chunks cost no CPU to read.
_MIN_SAVING_DIVISOR = 32


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def encode_chunk(data: bytes, cctx: zstandard.ZstdCompressor) -> tuple[bytes, Compression]:
    """The stored form of `data` and how it is stored."""
    packed = cctx.compress(data)
    if len(packed) + len(data) // _MIN_SAVING_DIVISOR < len(data):
        return packed, Compression.ZSTD
    return data, Compression.NONE


def decode_chunk(chunk: Chunk, stored: bytes | memoryview) -> bytes:
    """Stored bytes -> the chunk's uncompressed bytes, verified against `chunk.digest`.

    Raises IntegrityError if the bytes are not what the TOC promises (wrong length, not a valid
    zstd frame, wrong digest): a caller never sees unverified bytes.
    """
    if len(stored) != chunk.blob_size:
        raise IntegrityError(
            f"chunk {chunk.digest} at blob offset {chunk.blob_offset}: got {len(stored)} stored bytes, expected {chunk.blob_size}")
    if chunk.compression is Compression.ZSTD:
        try:
            data = zstandard.ZstdDecompressor().decompress(stored, max_output_size=chunk.size)
        except zstandard.ZstdError as exc:
            raise IntegrityError(f"chunk {chunk.digest} at blob offset {chunk.blob_offset} does not decompress: {exc}") from None
    else:
        data = bytes(stored)
    if len(data) != chunk.size or sha256_digest(data) != chunk.digest:
        raise IntegrityError(f"chunk at blob offset {chunk.blob_offset} does not match its digest {chunk.digest}")
    return data
