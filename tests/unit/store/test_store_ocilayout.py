"""OciLayoutStore specifics: the on-disk layout, atomicity and multi-process safety.

(Behaviour shared with the registry store is in tests/integration/store/test_store_behaviour.py.)
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os

import pytest

from rollstack.errors import BlobNotFound, IntegrityError, ManifestNotFound
from rollstack.store.names import OCI_MANIFEST
from rollstack.store.ocilayout import REF_ANNOTATION, REPO_ANNOTATION, OciLayoutStore


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def manifest(store: OciLayoutStore, repo: str, layer: bytes) -> bytes:
    store.put_blob(repo, digest_of(b"{}"), b"{}")
    store.put_blob(repo, digest_of(layer), layer)
    return json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": digest_of(b"{}"), "size": 2},
        "layers": [{"mediaType": "application/vnd.rollstack.layer.v1", "digest": digest_of(layer), "size": len(layer)}],
    }).encode()


def test_layout_files_follow_oci_image_layout(tmp_path):
    store = OciLayoutStore(tmp_path / "s")
    data = manifest(store, "os/debian", b"layer")
    digest = store.put_manifest("os/debian", "bookworm", data, OCI_MANIFEST)
    root = tmp_path / "s"
    assert json.loads((root / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads((root / "index.json").read_text())
    assert index["schemaVersion"] == 2
    assert index["manifests"] == [{
        "mediaType": OCI_MANIFEST, "digest": digest, "size": len(data),
        "annotations": {REPO_ANNOTATION: "os/debian", REF_ANNOTATION: "bookworm"},
    }]
    for d in (digest, digest_of(b"layer"), digest_of(b"{}")):
        blob = root / "blobs" / "sha256" / d.split(":")[1]
        assert digest_of(blob.read_bytes()) == d
    assert list((root / ".rollstack" / "tmp").iterdir()) == []  # no temp files left behind


def test_same_tag_in_two_repositories_is_independent(tmp_path):
    store = OciLayoutStore(tmp_path)
    da = store.put_manifest("a", "v1", manifest(store, "a", b"A"), OCI_MANIFEST)
    db = store.put_manifest("b", "v1", manifest(store, "b", b"B"), OCI_MANIFEST)
    assert store.get_manifest("a", "v1").digest == da
    assert store.get_manifest("b", "v1").digest == db
    with pytest.raises(ManifestNotFound):
        store.get_manifest("a", db)  # a digest is only reachable in the repository that holds it


def test_reopen_sees_same_content(tmp_path):
    s1 = OciLayoutStore(tmp_path)
    d = s1.put_manifest("r", "t", manifest(s1, "r", b"x"), OCI_MANIFEST)
    s2 = OciLayoutStore(tmp_path)
    assert s2.get_manifest("r", "t").digest == d
    assert s2.list_repositories() == ["r"]


def test_corrupt_blob_on_disk_is_integrity_error(tmp_path):
    store = OciLayoutStore(tmp_path)
    data = manifest(store, "r", b"x")
    d = store.put_manifest("r", "t", data, OCI_MANIFEST)
    (tmp_path / "blobs" / "sha256" / d.split(":")[1]).write_bytes(data + b" ")
    with pytest.raises(IntegrityError):
        store.get_manifest("r", "t")


def test_deleted_blob_file_is_blob_not_found(tmp_path):
    store = OciLayoutStore(tmp_path)
    store.put_blob("r", digest_of(b"gone"), b"gone")
    (tmp_path / "blobs" / "sha256" / digest_of(b"gone").split(":")[1]).unlink()
    assert not store.has_blob("r", digest_of(b"gone"))
    with pytest.raises(BlobNotFound):
        store.read_blob("r", digest_of(b"gone"), 0, 1)
    assert store.put_blob("r", digest_of(b"gone"), b"gone") is True  # can be healed by a new put


def test_failed_put_leaves_nothing(tmp_path):
    store = OciLayoutStore(tmp_path)
    with pytest.raises(IntegrityError):
        store.put_blob("r", digest_of(b"a"), b"b")
    assert list((tmp_path / "blobs" / "sha256").iterdir()) == []
    assert list((tmp_path / ".rollstack" / "tmp").iterdir()) == []


def test_large_read_is_complete(tmp_path):
    store = OciLayoutStore(tmp_path)
    data = os.urandom(3 << 20)
    store.put_blob("r", digest_of(data), data)
    assert store.read_blob("r", digest_of(data), 1, len(data)) == data[1:]


def _tag_many(root: str, worker: int, n: int) -> None:
    store = OciLayoutStore(root)
    for i in range(n):
        layer = f"w{worker}-{i}".encode()
        store.put_manifest("shared/repo", f"w{worker}-{i}", manifest(store, "shared/repo", layer), OCI_MANIFEST)


def test_concurrent_processes_lose_no_tags(tmp_path):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_tag_many, args=(str(tmp_path), w, 15)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    store = OciLayoutStore(tmp_path)
    assert len(store.list_tags("shared/repo")) == 60
    for w in range(4):
        assert store.get_manifest("shared/repo", f"w{w}-14").data


def test_corrupt_index_is_integrity_error(tmp_path):
    store = OciLayoutStore(tmp_path)
    (tmp_path / "index.json").write_text("{not json")
    with pytest.raises(IntegrityError):
        store.list_tags("r")


def test_foreign_index_entries_are_ignored(tmp_path):
    store = OciLayoutStore(tmp_path)
    (tmp_path / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": digest_of(b"x"), "size": 1,
         "annotations": {REF_ANNOTATION: "skopeo-tag"}}, "garbage", {"no": "digest"}]}))
    assert store.list_repositories() == [] and store.list_tags("r") == []
    d = store.put_manifest("r", "t", manifest(store, "r", b"y"), OCI_MANIFEST)
    assert store.get_manifest("r", "t").digest == d
    kept = json.loads((tmp_path / "index.json").read_text())["manifests"]
    assert any(e.get("annotations", {}).get(REF_ANNOTATION) == "skopeo-tag" for e in kept)  # left alone


def test_a_file_on_the_same_filesystem_is_linked_not_copied_and_still_verified(tmp_path):
    import hashlib

    import pytest

    from rollstack.errors import IntegrityError
    from rollstack.store.ocilayout import OciLayoutStore

    src = tmp_path / "big.blob"
    src.write_bytes(b"layer bytes" * 1000)
    digest = "sha256:" + hashlib.sha256(src.read_bytes()).hexdigest()
    with OciLayoutStore(tmp_path / "store") as store:
        with pytest.raises(IntegrityError):
            store.put_blob("r/x", "sha256:" + "0" * 64, src)
        assert not store.has_blob("r/x", "sha256:" + "0" * 64)
        assert store.put_blob("r/x", digest, src)
        assert store.read_blob("r/x", digest, 0, 11) == b"layer bytes"
        assert src.stat().st_nlink == 2  # shared inode: no copy
        assert list((tmp_path / "store").rglob("blob-link-*")) == []
