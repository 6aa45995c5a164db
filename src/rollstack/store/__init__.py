"""Artifact stores: OCI layout directory and OCI registry, behind one `ArtifactStore` interface.

    open_store(spec)          -> ArtifactStore   (`oci:PATH`, a path, `http(s)://host:port`)
    OciLayoutStore(root)      local OCI image layout, many repositories, no server
    RegistryStore(url, ...)   any OCI distribution registry (httpx)
    StoreBlobSource(...)      one blob as a format BlobSource (size/read_at)
    RegistryServer(root, ...) runs Debian's docker-registry (tests, `rollstack registry serve`)
"""

from __future__ import annotations

from rollstack.store.base import ArtifactStore, Manifest
from rollstack.store.ocilayout import OciLayoutStore
from rollstack.store.registry import RegistryStats, RegistryStore
from rollstack.store.retry import RetryPolicy
from rollstack.store.server import RegistryServer
from rollstack.store.source import StoreBlobSource
from rollstack.store.spec import default_store_spec, open_store

__all__ = [
    "ArtifactStore",
    "Manifest",
    "OciLayoutStore",
    "RegistryServer",
    "RegistryStats",
    "RegistryStore",
    "RetryPolicy",
    "StoreBlobSource",
    "default_store_spec",
    "open_store",
]
