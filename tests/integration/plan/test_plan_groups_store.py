"""Groups on real stores: publish, republish (uploads nothing), list, resolve, import; both the OCI
layout store and a real docker-registry (the shared `store` fixture runs each test on both)."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import tarfile
import time
import uuid
from pathlib import Path

import pytest

from oci_image_helpers import write_oci_image
from rollstack.errors import GroupNotFound, InvalidRequest
from rollstack.format.reader import open_toc, read_files
from rollstack.format import LAYER_MEDIA_TYPE, erofs
from rollstack.plan.groups import GROUP_ARTIFACT_TYPE, list_groups, publish_group, summarize
from rollstack.plan.imports import import_image
from rollstack.plan.resolve import Resolver
from rollstack.store import StoreBlobSource

pytestmark = pytest.mark.integration


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_publish_republish_list_resolve(store, tmp_path: Path):
    base = tree(tmp_path / "base", {"etc/os-release": "debian\n", "usr/bin/python3": "#!py\n"})
    repo = tree(tmp_path / "repo", {"work/attrs/setup.py": "setup()\n", "etc/os-release": "overridden\n"})
    os_name, repo_name = uniq("os/base"), uniq("repo/attrs")

    first = publish_group(store, f"{os_name}:bookworm", [base], kind="os")
    second = publish_group(store, f"{repo_name}:23.2.0", [repo])
    assert first.uploaded_blobs == 3 and first.uploaded_bytes > 0  # layer + its EROFS image + config
    again = publish_group(store, f"{os_name}:bookworm", [base], kind="os")
    assert (again.uploaded_blobs, again.uploaded_bytes, again.unchanged) == (0, 0, True)
    assert again.digest == first.digest

    manifest = json.loads(store.get_manifest(os_name, "bookworm").data)
    assert manifest["artifactType"] == GROUP_ARTIFACT_TYPE
    layer, image = manifest["layers"]  # the layer, then its EROFS image (plan/lowers.py)
    assert layer["mediaType"] == LAYER_MEDIA_TYPE
    assert image["mediaType"] == erofs.IMAGE_MEDIA_TYPE
    assert image["annotations"]["io.rollstack.erofs.layer"] == layer["digest"]
    assert first.layers[0]["erofs"] == {"digest": image["digest"], "size": image["size"]}
    source = StoreBlobSource(store, os_name, layer["digest"])
    toc = open_toc(source)
    packed = store.read_blob(os_name, image["digest"], 0, image["size"])
    inline = read_files(source, toc, erofs.inline_candidates(toc))  # the small files ride in the image
    assert {toc.at(p).path: data for p, data in inline.items()} == {
        "etc/os-release": b"debian\n", "usr/bin/python3": b"#!py\n"}
    assert erofs.unpack_image(packed) == erofs.build(toc, layer["digest"], inline)[0]
    assert manifest["annotations"]["io.rollstack.kind"] == "os"

    groups = {f"{g.name}:{g.tag}": g for g in list_groups(store)}
    assert groups[f"{os_name}:bookworm"].digest == first.digest
    assert groups[f"{repo_name}:23.2.0"].kind == "repo" and groups[f"{repo_name}:23.2.0"].layers == 1
    assert summarize(list(groups.values()))["artifacts"] >= 2

    resolver = Resolver(store, tmp_path / "cache", ttl=60)
    plan = {"groups": [f"{os_name}:bookworm", f"{repo_name}:23.2.0"],
            "evaluator": {"groups": [f"{os_name}@{first.digest}"], "command": "true"}}
    stack = resolver.resolve(plan)
    assert [layer.group for layer in stack.layers] == plan["groups"]
    assert [layer.digest for layer in stack.layers] == [first.layers[0]["digest"], second.layers[0]["digest"]]
    assert stack.evaluator is not None and stack.evaluator.layers[0].digest == first.layers[0]["digest"]
    assert (stack.layers[0].erofs, stack.layers[0].erofs_size) == (image["digest"], image["size"])
    other = Resolver(store, tmp_path / "cache", ttl=60)  # another process: the disk cache
    assert other.resolve(plan).layers == stack.layers and other.store_lookups == 0

    # the resolved layers are readable through the store, each the tree its group was made of
    # (how overlayfs stacks them is tested against the kernel in tests/integration/run)
    tocs = [open_toc(StoreBlobSource(store, layer.repo, layer.digest)) for layer in stack.layers]
    assert tocs[0].lookup("etc/os-release") is not None and tocs[1].lookup("etc/os-release") is not None
    assert [e.path for e in tocs[1].children("work/attrs")] == ["work/attrs/setup.py"]

    with pytest.raises(GroupNotFound, match="no/such-group:1"):
        resolver.resolve({"groups": [f"{os_name}:bookworm", "no/such-group:1"]})


def test_resolution_cache_rechecks_tags_after_ttl(store, tmp_path: Path):
    name = uniq("harness/agent")
    v1 = publish_group(store, f"{name}:2", [tree(tmp_path / "v1", {"agent.py": "1\n"})])
    resolver = Resolver(store, tmp_path / "cache", ttl=0.3)
    assert resolver.resolve_groups([f"{name}:2"]).groups[0].digest == v1.digest
    v2 = publish_group(store, f"{name}:2", [tree(tmp_path / "v2", {"agent.py": "2\n"})])
    lookups = resolver.store_lookups
    assert resolver.resolve_groups([f"{name}:2"]).groups[0].digest == v1.digest  # cached, fresh
    assert resolver.store_lookups == lookups
    time.sleep(0.35)
    assert resolver.resolve_groups([f"{name}:2"]).groups[0].digest == v2.digest  # re-checked
    # a second resolver shares the on-disk cache; digest references are never re-checked
    pinned = Resolver(store, tmp_path / "cache", ttl=0)
    pinned.resolve_groups([f"{name}@{v1.digest}"])
    before = pinned.store_lookups
    pinned.resolve_groups([f"{name}@{v1.digest}"])
    assert pinned.store_lookups == before


def test_publish_rejects_bad_names(oci_store, tmp_path: Path):
    src = tree(tmp_path / "s", {"f": "x"})
    for bad in ["Upper/x:1", "repo/x", "repo/x@sha256:" + "0" * 64]:
        with pytest.raises(InvalidRequest):
            publish_group(oci_store, bad, [src])


def _oci_image(path: Path, layers: list[dict[str, bytes]], tag: str = "t") -> Path:
    """A minimal OCI image layout with gzip tar layers (whiteouts as `.wh.` names)."""
    blobs = []
    for files in layers:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name, data in files.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mtime = 0
                tar.addfile(info, io.BytesIO(data))
        blobs.append(gzip.compress(buf.getvalue(), mtime=0))
    return write_oci_image(path, blobs, tag, config={"architecture": "amd64", "os": "linux",
                                                     "rootfs": {"type": "layers", "diff_ids": []}})


def test_import_from_oci_layout_and_registry(store, registry, tmp_path: Path):
    image = _oci_image(tmp_path / "image", [
        {"etc/a": b"a\n", "etc/b": b"b\n"},
        {"etc/.wh.a": b"", "etc/c": b"c\n"},
    ])
    cache = tmp_path / "cache"
    name = uniq("os/imported")

    first = import_image(f"oci:{image}:t", f"{name}:1", store, cache_dir=cache)
    assert (first.converted, first.cached) == (2, 0) and len(first.layers) == 2
    again = import_image(f"oci:{image}:t", f"{name}:1", store, cache_dir=cache)
    assert (again.converted, again.cached, again.uploaded_bytes) == (0, 2, 0)
    assert again.digest == first.digest
    assert all(layer["erofs"]["size"] > 0 for layer in first.layers)  # an image beside each layer

    stack = Resolver(store).resolve_groups([f"{name}:1"])
    tocs = [open_toc(StoreBlobSource(store, layer.repo, layer.digest)) for layer in stack.layers]
    assert [(e.path, e.type.value) for e in tocs[0].children("etc")] == [("etc/a", "reg"), ("etc/b", "reg")]
    assert [(e.path, e.type.value) for e in tocs[1].children("etc")] == [("etc/a", "whiteout"), ("etc/c", "reg")]

    # the same image pushed to the real registry imports through skopeo, from the cache
    remote = registry.url.split("://", 1)[1] + f"/src/{uuid.uuid4().hex[:8]}:t"
    subprocess.run(["skopeo", "copy", "-q", "--dest-tls-verify=false", f"oci:{image}:t", f"docker://{remote}"],
                   check=True, capture_output=True)
    via_registry = import_image(f"docker://{remote}", f"{name}:2", store, cache_dir=cache)
    assert via_registry.cached == 2 and via_registry.converted == 0
    assert [x["digest"] for x in via_registry.layers] == [x["digest"] for x in first.layers]
    fresh = import_image(f"docker://{remote}", f"{name}:3", store, cache_dir=tmp_path / "other-cache")
    assert fresh.converted == 2 and [x["digest"] for x in fresh.layers] == [x["digest"] for x in first.layers]
