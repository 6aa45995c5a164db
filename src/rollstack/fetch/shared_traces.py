"""Access traces shared through the artifact store, so a cold node prefetches what others recorded.

A trace (see `fetch.traces`) is published as a tiny OCI artifact in repository `rollstack/traces`:
an image manifest tagged with the SHA-256 hex of the trace key, a small JSON config and one layer
of media type `application/vnd.rollstack.trace.v1+json` holding
`{"v": 1, "key": K, "chunks": [[layer digest, chunk doc], ...]}` (entries in `TraceChunk`'s
document form, fetch/traces.py).

Whatever comes back from the store is untrusted: `decode_trace` checks the schema, the size,
that every chunk belongs to a layer of the asking environment's stack and lies inside that
layer's blob; anything else is `InvalidRequest` (the caller ignores the trace). The store I/O
here is blocking: callers run it in worker threads.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

from rollstack.errors import InvalidRequest, NotFound
from rollstack.fetch.traces import DIGEST, Trace, TraceChunk

REPO = "rollstack/traces"
TRACE_MEDIA_TYPE = "application/vnd.rollstack.trace.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.rollstack.trace.config.v1+json"
ARTIFACT_TYPE = "application/vnd.rollstack.trace.v1"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MAX_TRACE_BYTES = 4 << 20  # a 20000-chunk trace encodes to ~2.5 MB
MAX_ENTRIES = 20000


def trace_tag(key: str) -> str:
    """The manifest tag of a trace key (64 hex digits: always a valid tag, never reveals the key)."""
    return hashlib.sha256(key.encode()).hexdigest()


def _canonical(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def encode_trace(key: str, entries: Trace) -> bytes:
    return _canonical({"v": 1, "key": key, "chunks": [t.to_doc() for t in entries[:MAX_ENTRIES]]})


def decode_trace(data: bytes, key: str, layers: Mapping[str, int]) -> Trace:
    """The trace a published artifact holds, or InvalidRequest. `layers` maps the
    digests of the asking environment's layers to their blob sizes: a chunk of any other layer,
    or outside its blob, makes the whole trace invalid (it cannot be the trace of this stack)."""
    if not isinstance(data, (bytes, bytearray)) or len(data) > MAX_TRACE_BYTES:
        raise InvalidRequest("shared trace: not bytes or too large")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise InvalidRequest("shared trace: not JSON") from None
    if not isinstance(doc, dict) or doc.get("v") != 1 or doc.get("key") != key:
        raise InvalidRequest("shared trace: wrong version or key")
    chunks = doc.get("chunks")
    if not isinstance(chunks, list) or len(chunks) > MAX_ENTRIES:
        raise InvalidRequest("shared trace: 'chunks' is not a bounded list")
    out: Trace = []
    seen: set[tuple[str, int]] = set()
    for item in chunks:
        if not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], str):
            raise InvalidRequest("shared trace: an entry is not [layer digest, chunk]")
        if item[0] not in layers:
            raise InvalidRequest("shared trace: names a layer outside this environment's stack")
        t = TraceChunk.from_doc(item, layers[item[0]])
        if t.key not in seen:
            seen.add(t.key)
            out.append(t)
    return out


def build_artifact(key: str, entries: Trace) -> tuple[bytes, bytes, bytes]:
    """(config blob, trace blob, manifest) of a trace artifact."""
    blob = encode_trace(key, entries)
    config = _canonical({"v": 1, "chunks": min(len(entries), MAX_ENTRIES)})
    manifest = _canonical({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": _sha(config), "size": len(config)},
        "layers": [{"mediaType": TRACE_MEDIA_TYPE, "digest": _sha(blob), "size": len(blob)}],
    })
    return config, blob, manifest


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def publish(store: Any, key: str, entries: Trace) -> str:
    """Blocking: upload a trace and tag it; returns the manifest digest."""
    config, blob, manifest = build_artifact(key, entries)
    store.put_blob(REPO, _sha(config), config)
    store.put_blob(REPO, _sha(blob), blob)
    return store.put_manifest(REPO, trace_tag(key), manifest, OCI_MANIFEST)


def trace_blob_descriptor(manifest: bytes) -> tuple[str, int]:
    """(digest, size) of the trace layer of a manifest, or InvalidRequest."""
    try:
        doc = json.loads(manifest)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise InvalidRequest("shared trace: manifest is not JSON") from None
    layers = doc.get("layers") if isinstance(doc, dict) else None
    if not isinstance(layers, list) or len(layers) != 1 or not isinstance(layers[0], dict):
        raise InvalidRequest("shared trace: manifest must have exactly one layer")
    desc = layers[0]
    digest, size = desc.get("digest"), desc.get("size")
    if desc.get("mediaType") != TRACE_MEDIA_TYPE or not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise InvalidRequest("shared trace: manifest layer is not a trace")
    if type(size) is not int or not 0 < size <= MAX_TRACE_BYTES:
        raise InvalidRequest("shared trace: trace blob size out of bounds")
    return digest, size


def lookup(store: Any, key: str, layers: Mapping[str, int]) -> Trace | None:
    """Blocking: the published trace of `key` (None if there is none), validated against
    `layers`; InvalidRequest if it is malformed, other store errors propagate."""
    try:
        manifest = store.get_manifest(REPO, trace_tag(key))
    except NotFound:
        return None
    digest, size = trace_blob_descriptor(manifest.data)
    data = store.read_blob(REPO, digest, 0, size)
    if len(data) != size or _sha(data) != digest:
        raise InvalidRequest("shared trace: blob does not match its digest")
    return decode_trace(data, key, layers)
