"""`import_image`: an existing OCI/Docker image -> a rollstack layer group.

Sources: an OCI image layout directory (`oci:DIR[:TAG]`), or a registry (`docker://HOST/NAME:TAG`,
or `HOST/NAME:TAG`), read with skopeo (`skopeo inspect --raw` for manifests, `skopeo copy` into
a temporary OCI layout for layers). Each tar layer (plain, gzip, zstd) is converted with the
format's converter (OCI whiteouts become whiteout entries). Conversions are cached by the source
layer's digest in `cache_dir/import/` (a small JSON map plus the converted blobs), so importing
the same image again converts nothing and, when every layer is cached, downloads nothing.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

from rollstack.errors import InvalidRequest, ManifestNotFound, RegistryError, SourceInvalid
from rollstack.plan.groups import BuiltLayer, Progress, publish_images, publish_layers, split_name_tag
from rollstack.plan.import_io import LowerLayers, Uploader

INDEX_TYPES = {"application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json"}
MANIFEST_TYPES = {"application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"}


@dataclass(slots=True)
class ImportResult:
    name: str
    tag: str
    digest: str
    source: str
    source_manifest: str  # digest of the image manifest imported
    layers: list[dict[str, Any]] = field(default_factory=list)  # {"digest", "size", "source"}
    converted: int = 0  # layers converted now
    cached: int = 0  # layers taken from the conversion cache
    uploaded_bytes: int = 0
    uploaded_blobs: int = 0
    payload_bytes: int = 0  # unpacked file bytes of the layers converted now
    transfer: str = ""  # how converted layers were read: "layout", "registry-stream", "skopeo" ("" if all cached)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class _SourceLayer:
    digest: str
    media_type: str
    size: int


class ConversionCache:
    """source layer digest -> converted blob (digest, size), on disk, shared between processes."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root) / "import"
        self.blobs = self.root / "blobs"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.map_path = self.root / "layers.json"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.root / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            mapping: dict[str, dict[str, Any]] = json.loads(self.map_path.read_text())
            return mapping
        except (OSError, ValueError):
            return {}

    def get(self, source_digest: str, below: list[str] | None = None) -> tuple[str, int] | None:
        """The conversion of `source_digest`. One that asked the lower layers (an implied
        directory's metadata, a hardlink target) is only valid over the same layers `below`
        (source digests, bottom first), so it is filed under both."""
        doc = self._read()
        hit = doc.get(source_digest)
        if not hit or "below" in hit:  # ("below" in a plain entry: written by an older version)
            hit = doc.get(_chain_key(source_digest, below or []))
        return (hit["digest"], int(hit["size"])) if hit else None

    def blob_path(self, digest: str) -> Path:
        return self.blobs / digest.split(":", 1)[-1]

    def put(self, source_digest: str, digest: str, size: int, below: list[str] | None = None) -> None:
        with self._locked():
            doc = self._read()
            if below is None:
                doc[source_digest] = {"digest": digest, "size": size}
            else:
                doc[_chain_key(source_digest, below)] = {"digest": digest, "size": size, "below": below}
            tmp = self.map_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
            os.replace(tmp, self.map_path)


def _chain_key(source_digest: str, below: list[str]) -> str:
    import hashlib

    return f"{source_digest}@below:{hashlib.sha256(' '.join(below).encode()).hexdigest()[:32]}"


# -- reading images --------------------------------------------------------------------------------
def _pick_platform(index: dict[str, Any], what: str) -> str:
    manifests = index.get("manifests") or []
    if not isinstance(manifests, list) or not all(isinstance(m, dict) for m in manifests):
        raise SourceInvalid(f"{what}: malformed image index (manifests is not a list of objects)")
    if not manifests:
        raise SourceInvalid(f"{what}: empty image index")
    chosen = next((m for m in manifests if (m.get("platform") or {}).get("os") == "linux"
                   and (m.get("platform") or {}).get("architecture") == "amd64"), manifests[0])
    digest = chosen.get("digest")
    if not isinstance(digest, str):
        raise SourceInvalid(f"{what}: image index entry without a digest")
    return digest


def _layers_of(manifest: dict[str, Any], what: str) -> list[_SourceLayer]:
    if manifest.get("schemaVersion") != 2 or "layers" not in manifest:
        raise SourceInvalid(f"{what}: not an OCI / Docker schema 2 image manifest")
    out = []
    for layer in manifest["layers"]:
        media = layer.get("mediaType", "")
        if "tar" not in media and "rootfs" not in media:
            raise SourceInvalid(f"{what}: layer {layer.get('digest')} has media type {media!r}, not a tar layer")
        out.append(_SourceLayer(layer["digest"], media, int(layer.get("size", 0))))
    return out


class _OciLayout:
    def __init__(self, path: Path, tag: str | None) -> None:
        self.path = path
        if not (path / "index.json").is_file():
            raise SourceInvalid(f"{path}: not an OCI image layout (no index.json)")
        index = json.loads((path / "index.json").read_text())
        manifests = index.get("manifests") or []
        if tag is not None:
            manifests = [m for m in manifests if (m.get("annotations") or {}).get("org.opencontainers.image.ref.name") == tag]
            if not manifests:
                raise ManifestNotFound(f"{path}: no image tagged {tag!r}")
        if not manifests:
            raise SourceInvalid(f"{path}: the layout holds no image")
        if len(manifests) > 1:
            raise InvalidRequest(f"{path}: several images; name one as oci:{path}:TAG")
        desc = manifests[0]
        digest = desc["digest"]
        doc = self._json(digest)
        if desc.get("mediaType") in INDEX_TYPES or doc.get("mediaType") in INDEX_TYPES:
            digest = _pick_platform(doc, str(path))
            doc = self._json(digest)
        self.manifest_digest = digest
        self.layers = _layers_of(doc, str(path))

    def blob(self, digest: str) -> Path:
        algo, hexd = digest.split(":", 1)
        return self.path / "blobs" / algo / hexd

    def _json(self, digest: str) -> dict[str, Any]:
        try:
            doc: dict[str, Any] = json.loads(self.blob(digest).read_bytes())
            return doc
        except FileNotFoundError:
            raise SourceInvalid(f"{self.path}: blob {digest} missing") from None


def _skopeo(args: list[str]) -> bytes:
    if shutil.which("skopeo") is None:
        raise RegistryError("skopeo is not installed (Debian package skopeo)")
    proc = subprocess.run(["skopeo", *args], capture_output=True)
    if proc.returncode != 0:
        msg = proc.stderr.decode(errors="replace").strip().splitlines()
        text = msg[-1] if msg else f"exit {proc.returncode}"
        if "manifest unknown" in text or "name unknown" in text or "not found" in text:
            raise ManifestNotFound(f"image {args[-1]}: {text}")
        raise RegistryError(f"skopeo {args[0]} {args[-1]}: {text}")
    return proc.stdout


class _RegistryImage:
    def __init__(self, ref: str, tls_verify: bool) -> None:
        from rollstack.store.names import sha256_digest

        self.ref = ref if ref.startswith("docker://") else f"docker://{ref}"
        self.tls = "true" if tls_verify else "false"
        raw = _skopeo(["inspect", "--raw", f"--tls-verify={self.tls}", self.ref])
        doc = json.loads(raw)
        self.pinned = self.ref
        if doc.get("mediaType") in INDEX_TYPES or "manifests" in doc:
            repo = self.ref.rsplit("@", 1)[0]
            if ":" in repo.rsplit("/", 1)[-1]:
                repo = repo.rsplit(":", 1)[0]
            self.pinned = f"{repo}@{_pick_platform(doc, self.ref)}"
            raw = _skopeo(["inspect", "--raw", f"--tls-verify={self.tls}", self.pinned])
            doc = json.loads(raw)
        self.manifest_digest = sha256_digest(raw)
        self.layers = _layers_of(doc, self.ref)

    def download(self, dest: Path) -> _OciLayout:
        _skopeo(["copy", "-q", f"--src-tls-verify={self.tls}", self.pinned, f"oci:{dest}:image"])
        return _OciLayout(dest, "image")

    def streamer(self) -> Any:
        """A `store.stream.BlobStream` factory over the registry's blob API, or None when it
        cannot be reached that way (then layers come through `skopeo copy`)."""
        from rollstack.store.stream import open_registry_repo

        return open_registry_repo(self.ref, tls_verify=self.tls == "true")


def _open_source(image_ref: str, tls_verify: bool) -> _OciLayout | _RegistryImage:
    if image_ref.startswith("oci:"):
        rest = image_ref[4:]
        path, tag = Path(rest), None
        if not path.is_dir() and ":" in rest:
            head, tail = rest.rsplit(":", 1)
            path, tag = Path(head), tail
        if not path.is_dir():
            raise SourceInvalid(f"{image_ref}: {path} is not a directory")
        return _OciLayout(path, tag)
    if "://" in image_ref and not image_ref.startswith("docker://"):
        raise InvalidRequest(f"{image_ref!r}: use oci:DIR[:TAG] or docker://HOST/NAME:TAG")
    return _RegistryImage(image_ref, tls_verify)


# -- the import ------------------------------------------------------------------------------------
def import_image(image_ref: str, name_tag: str, store: Any, *, cache_dir: Path, kind: str | None = None,
                 tls_verify: bool = False, created: str | None = None, progress: Progress | None = None,
                 work_dir: Path | None = None, threads: int | None = None) -> ImportResult:
    """Convert IMAGE_REF's layers into group NAME:TAG in `store` (conversions cached by source digest).

    Cached layers are not downloaded or decompressed at all. The others stream into the
    converter (from the layout's file, or from the registry in ranged GETs on a download thread,
    digest-checked), and each finished blob is uploaded on a thread while the next one converts."""
    t0 = time.perf_counter()
    name, tag = split_name_tag(name_tag)
    cache = ConversionCache(cache_dir)
    source = _open_source(image_ref, tls_verify)
    result = ImportResult(name, tag, "", image_ref, source.manifest_digest)
    below = {layer.digest: [x.digest for x in source.layers[:i]] for i, layer in enumerate(source.layers)}
    todo = [layer for layer in source.layers if not _usable(cache, layer.digest, below[layer.digest], store, name)]
    with tempfile.TemporaryDirectory(prefix="rollstack-import-", dir=work_dir) as tmp, ExitStack() as stack, \
            Uploader(store, name) as uploader, LowerLayers(store, name) as lowers:
        closers: list[Callable[[], None]] = []
        stack.callback(lambda: [close() for close in closers])
        open_layer, result.transfer = _layer_opener(source, Path(tmp), closers) if todo else (None, "")
        if progress and todo:
            progress.start(f"convert {len(todo)} layer(s) of {image_ref}", sum(layer.size for layer in todo))
        built: list[BuiltLayer] = []
        for layer in source.layers:
            hit = cache.get(layer.digest, below[layer.digest]) if layer not in todo else None
            if hit is None:
                assert open_layer is not None
                hit, payload = _convert_layer(cache, layer, open_layer, threads, lowers, below[layer.digest])
                result.payload_bytes += payload
                result.converted += 1
                if progress:
                    progress.advance(layer.size)
            else:
                result.cached += 1
            path = cache.blob_path(hit[0])
            built.append(BuiltLayer(hit[0], hit[1], path if path.exists() else None, layer.digest))
            lowers.push(hit[0], built[-1].path)
            if built[-1].path is not None:
                uploader.submit(built[-1])
        if progress and todo:
            progress.done()
        images = publish_images(store, name, tag, built)  # plan/lowers.py, while the last uploads run
        uploader.wait()
        published = publish_layers(store, name, tag, built, kind=kind, source_desc=image_ref,
                                   created=created, progress=progress, images=images)
    result.digest = published.digest
    result.layers = published.layers
    result.uploaded_bytes = published.uploaded_bytes + uploader.uploaded_bytes
    result.uploaded_blobs = published.uploaded_blobs + uploader.uploaded_blobs
    result.seconds = round(time.perf_counter() - t0, 3)
    return result


def _layer_opener(source: _OciLayout | _RegistryImage, tmp: Path,
                  closers: list[Callable[[], None]]) -> tuple[Callable[[_SourceLayer], BinaryIO], str]:
    """How to read a source layer's bytes front to back: a file, or a registry stream."""
    if isinstance(source, _OciLayout):
        return (lambda layer: open(source.blob(layer.digest), "rb", buffering=0)), "layout"
    streams = source.streamer()
    if streams is not None:
        closers.append(streams.close)
        return (lambda layer: streams(layer.digest, layer.size)), "registry-stream"
    layout = source.download(tmp / "oci")  # registries only skopeo can talk to
    return (lambda layer: open(layout.blob(layer.digest), "rb", buffering=0)), "skopeo"


def _convert_layer(cache: ConversionCache, layer: _SourceLayer, open_layer: Callable[[_SourceLayer], BinaryIO],
                   threads: int | None, lowers: LowerLayers, below: list[str]) -> tuple[tuple[str, int], int]:
    """One source layer -> a blob in the cache (written next to it, renamed into place)."""
    from rollstack.format.convert import convert_tar

    fd, tmp_name = tempfile.mkstemp(prefix=".convert-", suffix=".tmp", dir=cache.blobs)
    lowers.used = False
    try:
        with os.fdopen(fd, "wb", buffering=1 << 20) as out, open_layer(layer) as src:
            try:
                info = convert_tar(src, out, threads=threads, lower=lowers)
            except SourceInvalid as exc:
                raise SourceInvalid(f"layer {layer.digest}: {exc}") from None
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, cache.blob_path(info.digest))
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    cache.put(layer.digest, info.digest, info.size, below if lowers.used else None)
    return (info.digest, info.size), info.payload_size


def _usable(cache: ConversionCache, source_digest: str, below: list[str], store: Any, repo: str) -> bool:
    hit = cache.get(source_digest, below)
    if hit is None:
        return False
    return cache.blob_path(hit[0]).exists() or store.has_blob(repo, hit[0])
