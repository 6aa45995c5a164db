"""Layer groups in a store: publishing (directories/tarballs -> layers -> one manifest) and listing.

A group is an OCI image manifest with `artifactType: application/vnd.rollstack.group.v1`, a small
JSON config blob (`application/vnd.rollstack.group.config.v1+json`: kind, layers, created,
source) and rollstack layer blobs (`application/vnd.rollstack.layer.v1`). Group `repo/attrs:23.2.0`
is the manifest tagged `23.2.0` in repository `repo/attrs`.

Publishing converts each source with the deterministic converter, so unchanged content gives the
same blob digests and the store skips them; if the tag already names a group with the same
layers, kind and source, the existing manifest is kept and nothing at all is uploaded.
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rollstack.errors import InvalidRequest, ManifestNotFound
from rollstack.plan import lowers
from rollstack.plan.artifacts import canonical, created_now, find_manifest, parse_manifest, put_manifest
from rollstack.plan.refs import GroupRef

GROUP_ARTIFACT_TYPE = "application/vnd.rollstack.group.v1"
GROUP_CONFIG_MEDIA_TYPE = "application/vnd.rollstack.group.config.v1+json"
ANN_KIND = "io.rollstack.kind"
ANN_CREATED = "org.opencontainers.image.created"
ANN_SOURCE = "io.rollstack.source"


class Progress(Protocol):
    """Reports long steps (the CLI draws rich bars on stderr); `advance` after each unit."""

    def start(self, description: str, total: int) -> None: ...

    def advance(self, amount: int = 1) -> None: ...

    def done(self) -> None: ...


@dataclass(frozen=True, slots=True)
class BuiltLayer:
    """A converted layer blob on local disk, ready to upload."""

    digest: str
    size: int
    path: Path | None  # None: known to be in the store already (import cache)
    source: str = ""


@dataclass(slots=True)
class PublishResult:
    name: str
    tag: str
    digest: str  # the group manifest's digest
    layers: list[dict[str, Any]] = field(default_factory=list)  # {"digest", "size", "source"[, "erofs"]}
    uploaded_bytes: int = 0
    uploaded_blobs: int = 0
    unchanged: bool = False  # the tag already named exactly this group

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class GroupInfo:
    name: str
    tag: str
    digest: str
    kind: str
    size: int  # sum of layer blob sizes
    layers: int
    created: str = ""
    source: str = ""
    layer_digests: list[str] = field(default_factory=list)
    layer_sizes: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def split_name_tag(text: str) -> tuple[str, str]:
    """`NAME:TAG` (a tag is required to publish: groups are referenced by it)."""
    ref = GroupRef.parse(text)
    if ref.pinned or ":" not in text.rsplit("/", 1)[-1]:
        raise InvalidRequest(f"{text!r}: publish needs NAME:TAG (e.g. repo/attrs:23.2.0)")
    assert ref.tag is not None
    return ref.name, ref.tag


def default_kind(name: str) -> str:
    """`repo/attrs` -> `repo`; a one-component name -> `group`."""
    return name.split("/", 1)[0] if "/" in name else "group"


def parse_group_manifest(data: bytes) -> dict[str, Any] | None:
    """The manifest document if it is a rollstack group, else None."""
    return parse_manifest(data, GROUP_ARTIFACT_TYPE, GROUP_CONFIG_MEDIA_TYPE)


def publish_layers(store: Any, name: str, tag: str, layers: list[BuiltLayer], *, kind: str | None = None,
                   source_desc: str | None = None, created: str | None = None,
                   progress: Progress | None = None, images: PublishedImages | None = None) -> PublishResult:
    """Upload `layers` (bottom first) and tag a group manifest over them. `images`: what
    `publish_images` already returned for these layers (an import builds them while its layer
    uploads run); else their EROFS images are published here."""
    kind = kind or default_kind(name)
    source_desc = source_desc or ", ".join(layer.source for layer in layers if layer.source)
    layer_docs = [{"digest": layer.digest, "size": layer.size, "source": layer.source} for layer in layers]
    result = PublishResult(name, tag, "", layer_docs)
    if progress:
        progress.start(f"upload {name}:{tag}", sum(layer.size for layer in layers))
    for layer in layers:
        if layer.path is None:
            if not store.has_blob(name, layer.digest):
                raise InvalidRequest(f"layer {layer.digest} is neither on disk nor in {name}")
        elif store.put_blob(name, layer.digest, layer.path):
            result.uploaded_bytes += layer.size
            result.uploaded_blobs += 1
        if progress:
            progress.advance(layer.size)
    if progress:
        progress.done()

    images = images or publish_images(store, name, tag, layers)
    result.uploaded_bytes += images.uploaded_bytes
    result.uploaded_blobs += images.uploaded_blobs
    for doc in layer_docs:
        if doc["digest"] in images.images:
            image_digest, image_size = images.images[doc["digest"]]
            doc["erofs"] = {"digest": image_digest, "size": image_size}
    if images.existing is not None and created is None:
        old_digest, old = images.existing
        ann = old.get("annotations") or {}
        if ([(d["digest"], d["size"]) for d in lowers.layer_descriptors(old)] == [(x.digest, x.size) for x in layers]
                and lowers.image_descriptors(old) == images.images
                and ann.get(ANN_KIND) == kind and ann.get(ANN_SOURCE, "") == source_desc):
            result.digest, result.unchanged = old_digest, True
            return result

    created = created or created_now()
    config = canonical({
        "kind": kind, "created": created, "source": source_desc,
        "layers": [{"digest": d["digest"], "size": d["size"], "source": d["source"]} for d in layer_docs],
    })
    from rollstack.store.names import sha256_digest

    config_digest = sha256_digest(config)
    if store.put_blob(name, config_digest, config):
        result.uploaded_bytes += len(config)
        result.uploaded_blobs += 1
    result.digest, _ = put_manifest(
        store, name, tag, GROUP_ARTIFACT_TYPE,
        {"mediaType": GROUP_CONFIG_MEDIA_TYPE, "digest": config_digest, "size": len(config)},
        lowers.manifest_layers([(layer.digest, layer.size) for layer in layers], images.images),
        {ANN_KIND: kind, ANN_CREATED: created, ANN_SOURCE: source_desc})
    return result


@dataclass(slots=True)
class PublishedImages:
    """What `publish_images` did for a group's layers."""

    images: dict[str, tuple[str, int]]  # layer digest -> (image digest, size)
    existing: tuple[str, dict[str, Any]] | None  # the manifest the tag named before: (digest, doc)
    uploaded_bytes: int = 0
    uploaded_blobs: int = 0


def publish_images(store: Any, name: str, tag: str, layers: list[BuiltLayer]) -> PublishedImages:
    """Each layer's EROFS metadata image (plan/lowers.py) in the store. An image the manifest
    that `tag` names already has is kept if the store still holds it; the others are built from
    the layer's TOC and its small files' verified bytes (`format.erofs.inline_candidates`; the
    local blob, else the store's, read in a few coalesced ranges) and uploaded."""
    from rollstack.format.erofs import inline_candidates
    from rollstack.format.reader import read_files, read_toc
    from rollstack.format.source import FileBlobSource
    from rollstack.store.names import sha256_digest
    from rollstack.store.source import StoreBlobSource

    existing = find_manifest(store, name, tag, parse_group_manifest)
    known = lowers.image_descriptors(existing[1]) if existing is not None else {}
    out = PublishedImages({}, existing)
    for layer in layers:
        if layer.digest in out.images:
            continue
        if layer.digest in known and store.has_blob(name, known[layer.digest][0]):
            out.images[layer.digest] = known[layer.digest]
            continue
        with (FileBlobSource(layer.path) if layer.path is not None
              else contextlib.nullcontext(StoreBlobSource(store, name, layer.digest, layer.size))) as src:
            toc = read_toc(src).toc
            inline = read_files(src, toc, inline_candidates(toc))
        image = lowers.image_for(toc, layer.digest, inline)
        if image is None:
            continue  # the layer stays on FUSE lowers
        digest = sha256_digest(image)
        if store.put_blob(name, digest, image):
            out.uploaded_bytes += len(image)
            out.uploaded_blobs += 1
        out.images[layer.digest] = (digest, len(image))
    return out


def convert_sources(sources: list[Path], work: Path, progress: Progress | None = None) -> list[BuiltLayer]:
    """Each directory/tarball converted into a layer blob under `work` (deterministic)."""
    from rollstack.format.convert import convert

    if progress:
        progress.start(f"convert {len(sources)} layer(s)", len(sources))
    built = []
    for i, src in enumerate(sources):
        info = convert(src, work / f"layer-{i}.blob")
        built.append(BuiltLayer(info.digest, info.size, work / f"layer-{i}.blob", Path(src).name))
        if progress:
            progress.advance()
    if progress:
        progress.done()
    return built


def publish_group(store: Any, name_tag: str, sources: list[Path], *, kind: str | None = None,
                  source_desc: str | None = None, created: str | None = None,
                  progress: Progress | None = None, work_dir: Path | None = None) -> PublishResult:
    """Publish SOURCES (directories or tarballs, bottom first) as group NAME:TAG in `store`."""
    name, tag = split_name_tag(name_tag)
    if not sources:
        raise InvalidRequest("a group needs at least one source (directory or tarball)")
    with tempfile.TemporaryDirectory(prefix="rollstack-publish-", dir=work_dir) as tmp:
        layers = convert_sources([Path(s) for s in sources], Path(tmp), progress)
        return publish_layers(store, name, tag, layers, kind=kind, source_desc=source_desc,
                              created=created, progress=progress)


def list_groups(store: Any) -> list[GroupInfo]:
    """Every tagged group in the store, sorted by name then tag (other manifests are skipped)."""
    out: list[GroupInfo] = []
    for repo in sorted(store.list_repositories()):
        for tag in sorted(store.list_tags(repo)):
            try:
                manifest = store.get_manifest(repo, tag)
            except ManifestNotFound:
                continue  # deleted between listing and reading
            doc = parse_group_manifest(manifest.data)
            if doc is None:
                continue
            layers = lowers.layer_descriptors(doc)
            ann = doc.get("annotations") or {}
            out.append(GroupInfo(
                name=repo, tag=tag, digest=manifest.digest, kind=ann.get(ANN_KIND, default_kind(repo)),
                size=sum(int(layer.get("size", 0)) for layer in layers), layers=len(layers),
                created=ann.get(ANN_CREATED, ""), source=ann.get(ANN_SOURCE, ""),
                layer_digests=[str(layer.get("digest")) for layer in layers],
                layer_sizes=[int(layer.get("size", 0)) for layer in layers],
            ))
    return out


def summarize(groups: list[GroupInfo]) -> dict[str, Any]:
    """Store-wide counts: distinct group artifacts (manifests), distinct layer blobs, their bytes."""
    layers: dict[str, int] = {}
    for g in groups:
        layers.update(zip(g.layer_digests, g.layer_sizes))
    return {
        "artifacts": len({g.digest for g in groups}),
        "tags": len(groups),
        "layers": len(layers),
        "layer_bytes": sum(layers.values()),
    }

