"""OCI images from directory trees, the way `docker build` would ship them: one gzip layer per tree.

`build_layer(tree, cache)` tars a tree (overlay whiteouts -> OCI `.wh.` entries, opaque
directories -> `.wh..wh..opq`), compresses it with pigz (gzip, what Docker registries serve) and
caches the blob by the tree's identity. `write_image(layout, tag, layers, config)` adds an image
manifest + config to an OCI image layout; `push(layout, tag, registry, repo)` copies it to a
registry with skopeo. Layers are shared: os + repo + harness images reuse the os and repo blobs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import tarfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from rollstack.errors import RuntimeFailure

LAYER_MEDIA = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG_MEDIA = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA = "application/vnd.oci.image.manifest.v1+json"
_OPAQUE_XATTRS = ("trusted.overlay.opaque", "user.overlay.opaque")


@dataclass(frozen=True, slots=True)
class LayerBlob:
    digest: str  # sha256:<hex> of the compressed blob
    diff_id: str  # sha256:<hex> of the uncompressed tar
    size: int  # compressed bytes
    tar_size: int  # uncompressed bytes
    path: str  # where the compressed blob is

    def descriptor(self) -> dict[str, object]:
        return {"mediaType": LAYER_MEDIA, "digest": self.digest, "size": self.size}


class _HashingWriter:
    def __init__(self, f: BinaryIO) -> None:
        self.f, self.h, self.n = f, hashlib.sha256(), 0

    def write(self, b: bytes) -> int:
        self.h.update(b)
        self.n += len(b)
        return self.f.write(b)

    def flush(self) -> None:
        self.f.flush()


def _is_opaque(path: str) -> bool:
    for x in _OPAQUE_XATTRS:
        try:
            if os.getxattr(path, x, follow_symlinks=False) == b"y":
                return True
        except OSError:
            continue
    return False


def write_tar(root: Path, out: BinaryIO) -> None:
    """A layer tar of `root` in OCI whiteout conventions (deterministic order, numeric owners)."""
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path, arc in _sorted_walk(root):
            st = os.lstat(path)
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                d, _, base = arc.rpartition("/")
                info = tarfile.TarInfo(f"{d}/.wh.{base}" if d else f".wh.{base}")
                info.mtime = int(st.st_mtime)
                tar.addfile(info)
                continue
            if stat.S_ISSOCK(st.st_mode):
                continue
            info = tar.gettarinfo(path, arcname=arc)
            info.uname = info.gname = ""
            if info.isreg():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
            if stat.S_ISDIR(st.st_mode) and _is_opaque(path):
                wh = tarfile.TarInfo(f"{arc}/.wh..wh..opq")
                wh.mtime = int(st.st_mtime)
                tar.addfile(wh)


def _sorted_walk(root: Path) -> Iterator[tuple[str, str]]:
    # Depth-first, each directory before its contents, names sorted: a reproducible tar.
    def rec(path: str, arc: str) -> Iterator[tuple[str, str]]:
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            name = f"{arc}/{e.name}" if arc else e.name
            yield e.path, name
            if e.is_dir(follow_symlinks=False):
                yield from rec(e.path, name)

    yield from rec(str(root), "")


def build_layer(tree: Path, blobs_dir: Path, cache_key: str, meta_dir: Path) -> LayerBlob:
    """The gzip layer of `tree`, built once per cache_key (stored in blobs_dir, by digest)."""
    meta_dir.mkdir(parents=True, exist_ok=True)
    meta = meta_dir / f"{cache_key}.json"
    if meta.exists():
        blob = LayerBlob(**json.loads(meta.read_text()))
        if Path(blob.path).exists():
            return blob
    blobs_dir.mkdir(parents=True, exist_ok=True)
    tmp_tar = blobs_dir / f".{cache_key}.tar"
    tmp_gz = blobs_dir / f".{cache_key}.tar.gz"
    try:
        with open(tmp_tar, "wb") as f:
            hw = _HashingWriter(f)
            write_tar(tree, hw)  # type: ignore[arg-type]
        diff_id, tar_size = "sha256:" + hw.h.hexdigest(), hw.n
        gz = shutil.which("pigz") or "gzip"
        with open(tmp_gz, "wb") as out:
            proc = subprocess.run([gz, "-c", "-6", str(tmp_tar)], stdout=out, stderr=subprocess.PIPE)
        if proc.returncode != 0:
            raise RuntimeFailure(f"{gz} failed: {proc.stderr.decode(errors='replace')}")
        h = hashlib.sha256()
        with open(tmp_gz, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        final = blobs_dir / h.hexdigest()
        os.replace(tmp_gz, final)
        blob = LayerBlob("sha256:" + h.hexdigest(), diff_id, final.stat().st_size, tar_size, str(final))
        meta.write_text(json.dumps(asdict(blob)))
        return blob
    finally:
        tmp_tar.unlink(missing_ok=True)
        tmp_gz.unlink(missing_ok=True)


def _put_json(blobs_dir: Path, doc: dict[str, object]) -> tuple[str, int]:
    data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    hexd = hashlib.sha256(data).hexdigest()
    (blobs_dir / hexd).write_bytes(data)
    return "sha256:" + hexd, len(data)


def init_layout(layout: Path) -> Path:
    """An (empty or existing) OCI image layout; returns its blobs/sha256 directory."""
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    if not (layout / "oci-layout").exists():
        (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    if not (layout / "index.json").exists():
        (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": []}))
    return blobs


def write_image(layout: Path, tag: str, layers: list[LayerBlob], *, workdir: str = "/",
                env: list[str] | None = None, cmd: list[str] | None = None) -> str:
    """Add image `tag` (layers bottom first, blobs already in the layout) -> manifest digest."""
    blobs = init_layout(layout)
    config = {
        "architecture": "amd64", "os": "linux",
        "config": {
            "Env": env or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Cmd": cmd or ["/bin/sh"], "WorkingDir": workdir,
        },
        "rootfs": {"type": "layers", "diff_ids": [b.diff_id for b in layers]},
    }
    cdig, csize = _put_json(blobs, config)
    manifest = {
        "schemaVersion": 2, "mediaType": MANIFEST_MEDIA,
        "config": {"mediaType": CONFIG_MEDIA, "digest": cdig, "size": csize},
        "layers": [b.descriptor() for b in layers],
    }
    mdig, msize = _put_json(blobs, manifest)
    index = json.loads((layout / "index.json").read_text())
    index["manifests"] = [m for m in index["manifests"]
                          if m.get("annotations", {}).get("org.opencontainers.image.ref.name") != tag]
    index["manifests"].append({"mediaType": MANIFEST_MEDIA, "digest": mdig, "size": msize,
                               "annotations": {"org.opencontainers.image.ref.name": tag}})
    (layout / "index.json").write_text(json.dumps(index))
    return mdig


def link_blob(layout: Path, blob: LayerBlob) -> None:
    """Make a cached layer blob part of the layout (hard link, no copy)."""
    dst = init_layout(layout) / blob.digest.split(":", 1)[1]
    if not dst.exists():
        try:
            os.link(blob.path, dst)
        except OSError:
            shutil.copy(blob.path, dst)


def push(layout: Path, tag: str, registry: str, repo: str) -> None:
    """skopeo copy oci:LAYOUT:TAG -> docker://REGISTRY/REPO:TAG over plain HTTP."""
    proc = subprocess.run(
        ["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}:{tag}", f"docker://{registry}/{repo}:{tag}"],
        capture_output=True, text=True,
    )
    if proc.returncode != 0:
        raise RuntimeFailure(f"skopeo copy {repo}:{tag} failed: {proc.stderr.strip()[-2000:]}")
