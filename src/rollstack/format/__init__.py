"""rollstack's seekable layer format: [chunked file payloads][zstd TOC][fixed footer].

Public surface (docs/format.md is the byte-exact specification):
- `Toc`, `TocEntry`, `Chunk`, `EntryType`, `Compression` (`format.toc`, pure data)
- `convert()`, `convert_tar()`/`convert_fileobj()`, `convert_dir()` -> `LayerInfo` (`format.convert`)
- `LayerWriter` (`format.writer`), `LayerReader`, `open_toc()`, `read_toc()`, `decode_chunk()` (`format.reader`)
- `BlobSource`, `FileBlobSource`, `BytesBlobSource`, `CountingBlobSource` (`format.source`)
- `verify_layer()` (`format.verify`)
"""

from __future__ import annotations

LAYER_MEDIA_TYPE = "application/vnd.rollstack.layer.v1"

from rollstack.format.toc import Chunk, Compression, EntryType, Toc, TocEntry  # noqa: E402
from rollstack.format.source import BlobSource, BytesBlobSource, CountingBlobSource, FileBlobSource  # noqa: E402
from rollstack.format.writer import DEFAULT_CHUNK_SIZE, LayerInfo, LayerWriter  # noqa: E402
from rollstack.format.reader import LayerReader, decode_chunk, open_toc, read_toc  # noqa: E402
from rollstack.format.convert import convert, convert_dir, convert_fileobj, convert_tar  # noqa: E402

__all__ = [
    "LAYER_MEDIA_TYPE", "Chunk", "Compression", "EntryType", "Toc", "TocEntry", "BlobSource",
    "BytesBlobSource", "CountingBlobSource", "FileBlobSource", "DEFAULT_CHUNK_SIZE", "LayerInfo",
    "LayerWriter", "LayerReader", "decode_chunk", "open_toc", "read_toc", "convert", "convert_dir",
    "convert_fileobj", "convert_tar",
]
