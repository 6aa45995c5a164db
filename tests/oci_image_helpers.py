"""An OCI image layout on disk, for the tests that import images (plan import, bench import).

    write_oci_image(root, [gzip_tar_bytes, ...], tag="t")   # bottom layer first
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path
from typing import Any

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def write_oci_image(root: Path, layers: list[bytes], tag: str = "t", config: dict[str, Any] | None = None) -> Path:
    """An OCI image layout at `root`: `layers` (gzip-compressed tars, bottom first) and a config
    (default: linux/amd64, `Cmd ["/bin/sh"]`, the layers' diff_ids), tagged `tag` in index.json."""
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> dict[str, Any]:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"digest": "sha256:" + digest, "size": len(data)}

    descs = [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **put(blob)} for blob in layers]
    if config is None:
        diff_ids = ["sha256:" + hashlib.sha256(gzip.decompress(blob)).hexdigest() for blob in layers]
        config = {"architecture": "amd64", "os": "linux", "config": {"Cmd": ["/bin/sh"]},
                  "rootfs": {"type": "layers", "diff_ids": diff_ids}}
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      **put(json.dumps(config).encode())},
                           "layers": descs}).encode()
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": OCI_MANIFEST, **put(manifest), "annotations": {"org.opencontainers.image.ref.name": tag}}]}))
    return root
