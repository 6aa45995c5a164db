"""Names the stores accept: OCI repository names, tags, digests, manifest media types (pure).

Both stores validate every name here before touching disk or network, so a hostile name can
never become a path outside an OCI layout and both stores reject the same inputs with the same
`InvalidRequest`. Only sha256 digests are supported (what every registry uses).
"""

from __future__ import annotations

import hashlib
import re
from typing import BinaryIO

from rollstack.errors import IntegrityError, InvalidRequest

# distribution/reference grammar: path components of lowercase alphanumerics and separators.
_REPO_RE = re.compile(r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*)*")
_TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_DIGEST_RE = re.compile(r"sha256:[a-f0-9]{64}")

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
IMAGE_MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)  # reference a config and layers
INDEX_MANIFEST_TYPES = (OCI_INDEX, DOCKER_LIST)  # reference other manifests
MANIFEST_TYPES = IMAGE_MANIFEST_TYPES + INDEX_MANIFEST_TYPES

_HASH_BLOCK = 1 << 20


def check_repo(repo: str) -> str:
    if not isinstance(repo, str) or len(repo) > 255 or not _REPO_RE.fullmatch(repo):
        raise InvalidRequest(f"invalid repository name {repo!r}", repo=str(repo))
    return repo


def check_tag(tag: str) -> str:
    if not isinstance(tag, str) or not _TAG_RE.fullmatch(tag):
        raise InvalidRequest(f"invalid tag {tag!r}", tag=str(tag))
    return tag


def check_digest(digest: str) -> str:
    if not isinstance(digest, str) or not _DIGEST_RE.fullmatch(digest):
        raise InvalidRequest(f"invalid digest {digest!r} (want sha256:<64 hex>)", digest=str(digest))
    return digest


def is_digest(ref: str) -> bool:
    return isinstance(ref, str) and ref.startswith("sha256:")


def check_ref(ref: str) -> str:
    """A manifest reference: a digest or a tag."""
    return check_digest(ref) if is_digest(ref) else check_tag(ref)


def check_manifest_type(media_type: str) -> str:
    if media_type not in MANIFEST_TYPES:
        raise InvalidRequest(f"unsupported manifest media type {media_type!r}", media_type=media_type)
    return media_type


def check_manifest_data(data: bytes) -> bytes:
    if not isinstance(data, (bytes, bytearray)):
        raise InvalidRequest(f"manifest data must be bytes, not {type(data).__name__}")
    return bytes(data)


def check_range(offset: int, length: int) -> None:
    if not isinstance(offset, int) or not isinstance(length, int) or offset < 0 or length < 0:
        raise InvalidRequest(f"invalid range offset={offset} length={length}")


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def digest_hex(digest: str) -> str:
    return check_digest(digest).split(":", 1)[1]


def stream_blocks(f: BinaryIO, block: int = _HASH_BLOCK):
    while chunk := f.read(block):
        yield chunk


def manifest_references(data: bytes, media_type: str) -> tuple[list[str], list[str]]:
    """(blob digests, child manifest digests) a manifest points at; InvalidRequest if malformed.

    Registries refuse a manifest whose blobs are not in the repository; both stores check
    the same references so they refuse the same manifests."""
    import json

    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"manifest is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidRequest("manifest is not a JSON object")
    if doc.get("mediaType") not in (None, media_type):
        raise InvalidRequest(f"manifest mediaType {doc.get('mediaType')!r} != {media_type!r}")

    def digests(items: object, key: str, skip_urls: bool) -> list[str]:
        if items is None:
            return []
        if not isinstance(items, list):
            raise InvalidRequest(f"manifest field {key!r} is not a list")
        out = []
        for d in items:
            if not isinstance(d, dict) or not isinstance(d.get("digest"), str):
                raise InvalidRequest(f"manifest field {key!r} holds a bad descriptor")
            if skip_urls and d.get("urls"):
                continue  # foreign layers live elsewhere
            out.append(check_digest(d["digest"]))
        return out

    if media_type in INDEX_MANIFEST_TYPES:
        return [], digests(doc.get("manifests"), "manifests", False)
    config = doc.get("config")
    if not isinstance(config, dict):
        raise InvalidRequest("image manifest has no config descriptor")
    return digests([config], "config", False) + digests(doc.get("layers"), "layers", True), []


def check_manifest_put(repo: str, ref: str, data: bytes, media_type: str) -> tuple[bytes, str, list[str], list[str]]:
    """Everything both stores check before storing a manifest, in the same order, so they refuse
    the same requests: (data, its digest, referenced blobs, referenced child manifests)."""
    check_repo(repo)
    check_ref(ref)
    check_manifest_type(media_type)
    data = check_manifest_data(data)
    digest = sha256_digest(data)
    if is_digest(ref) and ref != digest:
        raise IntegrityError(f"manifest digest {digest} != reference {ref}", digest=digest)
    blobs, children = manifest_references(data, media_type)
    return data, digest, blobs, children
