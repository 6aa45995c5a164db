"""What groups and published plans share as OCI artifacts in a store: canonical JSON, finding the
manifest a tag names (of one artifact kind), and pushing a manifest under a tag.

    found = find_manifest(store, "repo/attrs", "23.2.0", parse_group_manifest)  # (digest, doc) | None
    digest, doc = put_manifest(store, repo, tag, GROUP_ARTIFACT_TYPE,
                               {"mediaType": GROUP_CONFIG_MEDIA_TYPE, "digest": d, "size": n},
                               layers, annotations)
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Callable

from rollstack.errors import GroupNotFound, ManifestNotFound
from rollstack.store.names import OCI_MANIFEST


def canonical(doc: Any) -> bytes:
    """`doc` as canonical JSON bytes (sorted keys, no spaces): equal documents, equal digests."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def parse_manifest(data: bytes, artifact_type: str, config_media_type: str) -> dict[str, Any] | None:
    """The manifest document in `data` if it is an artifact of `artifact_type` (or, from a registry
    that drops `artifactType`, has a config of `config_media_type`), else None."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    if doc.get("artifactType") == artifact_type or (doc.get("config") or {}).get("mediaType") == config_media_type:
        return doc
    return None


def created_now() -> str:
    """The `created` annotation for a manifest pushed now (UTC, seconds)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def find_manifest(store: Any, repo: str, ref: str,
                  parse: Callable[[bytes], dict[str, Any] | None]) -> tuple[str, dict[str, Any]] | None:
    """(digest, document) of the manifest `repo:ref` if it is there and `parse` accepts it (the
    artifact kind's parser: None for another kind), else None."""
    try:
        manifest = store.get_manifest(repo, ref)
    except (ManifestNotFound, GroupNotFound):
        return None
    except Exception as exc:  # noqa: BLE001 - an unknown repository is "not there" on some registries
        if getattr(exc, "code", "") in ("not_found", "manifest_not_found", "blob_not_found"):
            return None
        raise
    doc = parse(manifest.data)
    return None if doc is None else (manifest.digest, doc)


def put_manifest(store: Any, repo: str, tag: str, artifact_type: str, config: dict[str, Any],
                 layers: list[dict[str, Any]], annotations: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """Push an OCI image manifest of `artifact_type` over `config` and `layers` (descriptors whose
    blobs are in the store already) and tag it `repo:tag`; (its digest, the manifest document)."""
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": artifact_type,
        "config": config,
        "layers": layers,
        "annotations": annotations,
    }
    return store.put_manifest(repo, tag, canonical(manifest), OCI_MANIFEST), manifest
