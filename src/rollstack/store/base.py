"""The artifact store interface: blobs and manifests in OCI repositories.

Two implementations behave identically (one shared test suite runs against both):
`OciLayoutStore` (a local OCI image layout directory, no server) and `RegistryStore` (any OCI
distribution registry over HTTP). Repositories are OCI names such as `os/debian-python`; a
group `os/debian-python:bookworm` is the manifest tagged `bookworm` in that repository.
All methods are blocking and thread-safe; async callers run them in a worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class Manifest:
    digest: str  # "sha256:<hex>" of `data`
    media_type: str
    data: bytes


@runtime_checkable
class ArtifactStore(Protocol):
    """What every store offers. Errors: BlobNotFound, ManifestNotFound, RegistryUnavailable, ..."""

    url: str  # how to name this store again (`oci:/path` or `http://host:port`)

    def has_blob(self, repo: str, digest: str) -> bool: ...

    def blob_size(self, repo: str, digest: str) -> int: ...

    def read_blob(self, repo: str, digest: str, offset: int, length: int) -> bytes:
        """Bytes [offset, offset+length) of a blob (one range request on a registry).

        Short only at the blob's end."""
        ...

    def put_blob(self, repo: str, digest: str, data: bytes | Path | BinaryIO) -> bool:
        """Stores a blob unless it is already there; True if bytes were uploaded."""
        ...

    def put_manifest(self, repo: str, ref: str, data: bytes, media_type: str) -> str:
        """Stores a manifest under a tag (or digest); returns its digest."""
        ...

    def get_manifest(self, repo: str, ref: str) -> Manifest: ...

    def has_manifest(self, repo: str, ref: str) -> bool: ...

    def delete_manifest(self, repo: str, digest: str) -> None:
        """Removes the manifest and every tag pointing at it; ManifestNotFound if absent."""
        ...

    def delete_blob(self, repo: str, digest: str) -> None:
        """Unlinks the blob from the repository (storage is reclaimed by a separate GC)."""
        ...

    def list_tags(self, repo: str) -> list[str]:
        """Sorted tags of a repository; [] for an unknown repository."""
        ...

    def list_repositories(self) -> list[str]:
        """Sorted names of repositories holding at least one blob or manifest."""
        ...

    def close(self) -> None: ...
