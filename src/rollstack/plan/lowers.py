"""EROFS metadata images published beside a group's layers, so no node builds them.

A node stacks a layer as an in-kernel EROFS mount over its lazy-store blob (lowers/erofs.py) once
it has the layer's EROFS metadata image, built from the layer's TOC (format/erofs.py) and, when
published, carrying the bytes of its small files (`format.erofs.inline_candidates`).
Built on the node, that image costs a process and ~0.1-0.8 s of CPU beside the environment's
cold start, so the first environment of a stack ran on FUSE lowers and the second waited for the
build or read everything again through a new mount's cold page cache. Published at
`group publish` / `group import` time it is one small blob fetched with the manifest, and
every environment, the first included, starts on EROFS lowers.

In the group manifest each image is one more descriptor in `layers`, after the rollstack
layers, so a registry keeps it (garbage collection follows `layers`) and it is trusted exactly
as far as the manifest that names the layers:

    {"mediaType": "application/vnd.rollstack.erofs.v2+zstd", "digest": D, "size": N,
     "annotations": {"io.rollstack.erofs.layer": "<the layer's digest>"}}

The blob is the image zstd-compressed (`format.erofs.pack_image`, ~6x smaller).

The media type carries `format.erofs.IMAGE_VERSION`: an image of another version names other
blob offsets and is ignored (the node builds its own). A layer EROFS cannot express has no image.
Pure functions over manifest documents and TOCs; the store I/O lives in `plan.groups`.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from rollstack.format import LAYER_MEDIA_TYPE
from rollstack.format.erofs import IMAGE_MEDIA_TYPE, MAX_IMAGE_BYTES

ANN_LAYER = "io.rollstack.erofs.layer"
IMAGE_MEDIA_PREFIX = "application/vnd.rollstack.erofs."  # any version: never a layer


def layer_descriptors(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The manifest's rollstack layers (bottom first), without the images published beside them."""
    return [d for d in doc.get("layers") or [] if not str(d.get("mediaType", "")).startswith(IMAGE_MEDIA_PREFIX)]


def image_descriptors(doc: Mapping[str, Any]) -> dict[str, tuple[str, int]]:
    """Layer digest -> (image digest, size) for every image of this version the manifest names
    for one of its own layers (anything else is ignored: an image is only ever an optimisation)."""
    from rollstack.errors import InvalidRequest
    from rollstack.store.names import check_digest

    def valid(digest: object) -> bool:
        try:
            return isinstance(digest, str) and check_digest(digest) == digest
        except InvalidRequest:
            return False

    layers = {str(d.get("digest")) for d in layer_descriptors(doc)}
    out: dict[str, tuple[str, int]] = {}
    for d in doc.get("layers") or []:
        if d.get("mediaType") != IMAGE_MEDIA_TYPE:
            continue
        layer = (d.get("annotations") or {}).get(ANN_LAYER)
        digest, size = d.get("digest"), d.get("size")
        if (layer in layers and valid(digest) and isinstance(size, int) and not isinstance(size, bool)
                and 0 < size <= MAX_IMAGE_BYTES):
            out[str(layer)] = (digest, size)
    return out


def descriptor(layer_digest: str, image_digest: str, size: int) -> dict[str, Any]:
    return {"mediaType": IMAGE_MEDIA_TYPE, "digest": image_digest, "size": size,
            "annotations": {ANN_LAYER: layer_digest}}


def image_for(toc: Any, layer_digest: str, inline: Mapping[int, bytes] | None = None) -> bytes | None:
    """The layer's image in its stored form (`format.erofs.pack_image`), with the small files of
    `inline` (TOC position -> bytes, `format.erofs.inline_candidates`) stored in it; None if
    EROFS cannot express the layer (it stays on FUSE) or the image would be over MAX_IMAGE_BYTES."""
    from rollstack.errors import FormatError
    from rollstack.format import erofs

    try:
        image = erofs.build(toc, layer_digest, inline)[0]
    except FormatError:
        return None
    return erofs.pack_image(image) if len(image) <= MAX_IMAGE_BYTES else None


def manifest_layers(layers: Iterable[tuple[str, int]], images: Mapping[str, tuple[str, int]]) -> list[dict[str, Any]]:
    """The `layers` of a group manifest: the rollstack layers, then each one's image."""
    layers = list(layers)
    docs = [{"mediaType": LAYER_MEDIA_TYPE, "digest": d, "size": s} for d, s in layers]
    docs += [descriptor(d, *images[d]) for d, _ in layers if d in images]
    return docs
