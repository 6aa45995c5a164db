"""Both stores are real OCI: skopeo reads our layout and copies it into the registry, where
RegistryStore finds the very same manifest digest."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest

from components import require_tool
from rollstack.store import OciLayoutStore
from rollstack.store.names import OCI_MANIFEST

pytestmark = pytest.mark.integration


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_skopeo_reads_layout_and_copies_to_registry(tmp_path, registry_store, registry, unique_repo):
    require_tool("skopeo")  # Debian package skopeo
    store = OciLayoutStore(tmp_path / "layout")
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    store.put_blob(unique_repo, digest_of(config), config)
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest_of(config), "size": len(config)},
        "layers": [],
    }).encode()
    digest = store.put_manifest(unique_repo, "v1", manifest, OCI_MANIFEST)

    raw = subprocess.run(["skopeo", "inspect", "--raw", f"oci:{tmp_path / 'layout'}:v1"],
                         check=True, capture_output=True, timeout=60).stdout
    assert raw.strip() == manifest

    dest = f"docker://{registry.url.removeprefix('http://')}/{unique_repo}:v1"
    subprocess.run(["skopeo", "copy", "--dest-tls-verify=false", f"oci:{tmp_path / 'layout'}:v1", dest],
                   check=True, capture_output=True, timeout=120)
    got = registry_store.get_manifest(unique_repo, "v1")
    assert (got.digest, got.media_type) == (digest, OCI_MANIFEST)
    assert registry_store.read_blob(unique_repo, digest_of(config), 0, 1000) == config
