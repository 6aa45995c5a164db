"""One behaviour suite, run against BOTH stores (OCI layout and the real docker-registry).

Whatever a test asserts here holds for every `ArtifactStore`: that is the contract.
"""

from __future__ import annotations

import hashlib
import io
import json
import os

import pytest

from rollstack.errors import BlobNotFound, IntegrityError, InvalidRequest, ManifestNotFound
from rollstack.store import StoreBlobSource
from rollstack.store.names import OCI_INDEX, OCI_MANIFEST

pytestmark = pytest.mark.integration


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def upload_requests(store) -> int:
    """PUT + PATCH requests a registry store sent (0 for stores without a wire)."""
    stats = getattr(store, "stats", None)
    if stats is None:
        return 0
    req = stats.snapshot()["requests"]
    return req.get("PUT", 0) + req.get("PATCH", 0)


def image_manifest(store, repo: str, layers: list[bytes], config: bytes = b"{}") -> bytes:
    store.put_blob(repo, digest_of(config), config)
    for layer in layers:
        store.put_blob(repo, digest_of(layer), layer)
    doc = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": "application/vnd.rollstack.group.v1",
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": digest_of(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.rollstack.layer.v1", "digest": digest_of(x), "size": len(x)} for x in layers],
    }
    return json.dumps(doc, sort_keys=True).encode()


# -- blobs ---------------------------------------------------------------------------------


def test_put_then_range_reads(store, unique_repo):
    data = os.urandom(100_000)
    d = digest_of(data)
    assert not store.has_blob(unique_repo, d)
    assert store.put_blob(unique_repo, d, data) is True
    assert store.has_blob(unique_repo, d)
    assert store.blob_size(unique_repo, d) == len(data)
    assert store.read_blob(unique_repo, d, 0, len(data)) == data
    assert store.read_blob(unique_repo, d, 12_345, 1000) == data[12_345:13_345]
    assert store.read_blob(unique_repo, d, len(data) - 10, 1000) == data[-10:]  # short at the end
    assert store.read_blob(unique_repo, d, len(data), 10) == b""
    assert store.read_blob(unique_repo, d, len(data) + 5000, 10) == b""
    assert store.read_blob(unique_repo, d, 7, 0) == b""
    assert store.read_blob(unique_repo, d, 99_000, 1 << 62) == data[99_000:]  # no huge buffer
    assert store.read_blob(unique_repo, d, 1 << 62, 10) == b""


def test_several_ranges_in_one_read(store, unique_repo):
    """Docker's registry answers multi-range GETs (multipart/byteranges): one request for many
    scattered spans; the OCI layout store reads them one by one; same bytes either way."""
    from rollstack.store import byteranges

    data = os.urandom(300_000)
    d = digest_of(data)
    store.put_blob(unique_repo, d, data)
    spans = [(0, 1), (10, 4096), (50_000, 17), (123_456, 100_000), (299_990, 10)]
    gets = (lambda: store.stats.snapshot()["requests"].get("GET", 0)) if hasattr(store, "stats") else (lambda: 0)
    before = gets()
    assert byteranges.read_ranges(store, unique_repo, d, spans) == [data[o:o + n] for o, n in spans]
    if hasattr(store, "stats"):
        assert gets() - before == 1 and store.multi_range is True  # one GET for five spans
    many = [(i * 1000, 100) for i in range(150)]  # more spans than one Range header takes
    assert byteranges.read_ranges(store, unique_repo, d, many) == [data[o:o + n] for o, n in many]


def test_put_twice_uploads_once(store, unique_repo):
    data = os.urandom(5000)
    d = digest_of(data)
    assert store.put_blob(unique_repo, d, data) is True
    sent = upload_requests(store)
    assert store.put_blob(unique_repo, d, data) is False
    assert upload_requests(store) == sent  # the second put sent no bytes
    assert store.read_blob(unique_repo, d, 0, 10) == data[:10]


def test_blob_in_other_repo_needs_put_but_no_bytes(store, unique_repo):
    data = os.urandom(3000)
    d = digest_of(data)
    other = unique_repo + "-other"
    store.put_blob(unique_repo, d, data)
    assert not store.has_blob(other, d)
    with pytest.raises(BlobNotFound):
        store.read_blob(other, d, 0, 1)
    sent = upload_requests(store)
    assert store.put_blob(other, d, data) is False  # mounted / linked, not uploaded
    assert upload_requests(store) == sent
    assert store.read_blob(other, d, 100, 50) == data[100:150]


def test_put_from_path_and_stream(store, unique_repo, tmp_path):
    data = os.urandom(300_000)
    d = digest_of(data)
    path = tmp_path / "blob"
    path.write_bytes(data)
    if hasattr(store, "chunk_size"):
        store.chunk_size = 64 * 1024  # force the chunked (PATCH) upload path
    assert store.put_blob(unique_repo, d, path) is True
    assert store.read_blob(unique_repo, d, 250_000, 100_000) == data[250_000:]
    data2 = os.urandom(1000)
    assert store.put_blob(unique_repo, digest_of(data2), io.BytesIO(data2)) is True
    assert store.read_blob(unique_repo, digest_of(data2), 0, 2000) == data2


def test_wrong_digest_is_rejected_and_not_stored(store, unique_repo, tmp_path):
    data = b"real bytes"
    wrong = digest_of(b"other bytes")
    with pytest.raises(IntegrityError):
        store.put_blob(unique_repo, wrong, data)
    path = tmp_path / "f"
    path.write_bytes(data)
    with pytest.raises(IntegrityError):
        store.put_blob(unique_repo, wrong, path)
    assert not store.has_blob(unique_repo, wrong)


def test_missing_blob_is_typed(store, unique_repo):
    d = digest_of(b"never stored")
    assert not store.has_blob(unique_repo, d)
    with pytest.raises(BlobNotFound):
        store.blob_size(unique_repo, d)
    with pytest.raises(BlobNotFound):
        store.read_blob(unique_repo, d, 0, 10)
    with pytest.raises(BlobNotFound):
        store.read_blob(unique_repo, d, 0, 0)


@pytest.mark.parametrize("repo", ["UPPER", "../escape", "a//b", "/abs", "", "a/_x"])
def test_invalid_names_rejected(store, repo):
    with pytest.raises(InvalidRequest):
        store.has_blob(repo, digest_of(b"x"))
    with pytest.raises(InvalidRequest):
        store.put_blob(repo, digest_of(b"x"), b"x")


def test_bad_blob_data_rejected(store, unique_repo, tmp_path):
    d = digest_of(b"x")
    for bad in (tmp_path, tmp_path / "missing", 42, "not/a/file"):
        with pytest.raises(InvalidRequest):
            store.put_blob(unique_repo, d, bad)
    assert not store.has_blob(unique_repo, d)
    with pytest.raises(InvalidRequest):
        store.put_manifest(unique_repo, "t", "{}", OCI_MANIFEST)  # str, not bytes


def test_invalid_digest_and_range_rejected(store, unique_repo):
    with pytest.raises(InvalidRequest):
        store.has_blob(unique_repo, "sha256:../../etc/passwd")
    with pytest.raises(InvalidRequest):
        store.read_blob(unique_repo, digest_of(b"x"), -1, 10)


# -- manifests -----------------------------------------------------------------------------


def test_manifest_by_tag_and_digest(store, unique_repo):
    data = image_manifest(store, unique_repo, [b"layer one", b"layer two"])
    digest = store.put_manifest(unique_repo, "v1", data, OCI_MANIFEST)
    assert digest == digest_of(data)
    by_tag = store.get_manifest(unique_repo, "v1")
    by_digest = store.get_manifest(unique_repo, digest)
    assert by_tag == by_digest
    assert (by_tag.digest, by_tag.media_type, by_tag.data) == (digest, OCI_MANIFEST, data)
    assert store.has_manifest(unique_repo, "v1") and store.has_manifest(unique_repo, digest)
    assert not store.has_manifest(unique_repo, "v2")
    assert store.list_tags(unique_repo) == ["v1"]


def test_retag_keeps_old_manifest_by_digest(store, unique_repo):
    old = image_manifest(store, unique_repo, [b"a"])
    new = image_manifest(store, unique_repo, [b"b"])
    d_old = store.put_manifest(unique_repo, "latest", old, OCI_MANIFEST)
    d_new = store.put_manifest(unique_repo, "latest", new, OCI_MANIFEST)
    store.put_manifest(unique_repo, "pinned", new, OCI_MANIFEST)
    assert store.get_manifest(unique_repo, "latest").digest == d_new
    assert store.get_manifest(unique_repo, d_old).data == old
    assert store.list_tags(unique_repo) == ["latest", "pinned"]


def test_manifest_put_by_digest_is_untagged(store, unique_repo):
    data = image_manifest(store, unique_repo, [b"untagged"])
    digest = store.put_manifest(unique_repo, digest_of(data), data, OCI_MANIFEST)
    assert store.get_manifest(unique_repo, digest).data == data
    assert store.list_tags(unique_repo) == []


def test_manifest_digest_reference_mismatch(store, unique_repo):
    data = image_manifest(store, unique_repo, [b"x"])
    with pytest.raises(IntegrityError):
        store.put_manifest(unique_repo, digest_of(b"something else"), data, OCI_MANIFEST)


def test_manifest_with_missing_blob_is_refused(store, unique_repo):
    doc = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": digest_of(b"{}"), "size": 2},
        "layers": [{"mediaType": "application/vnd.rollstack.layer.v1", "digest": digest_of(b"absent"), "size": 6}],
    }
    store.put_blob(unique_repo, digest_of(b"{}"), b"{}")
    with pytest.raises(BlobNotFound):
        store.put_manifest(unique_repo, "bad", json.dumps(doc).encode(), OCI_MANIFEST)
    assert not store.has_manifest(unique_repo, "bad")


def test_index_of_manifests(store, unique_repo):
    child = image_manifest(store, unique_repo, [b"child layer"])
    d_child = store.put_manifest(unique_repo, digest_of(child), child, OCI_MANIFEST)
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX,
             "manifests": [{"mediaType": OCI_MANIFEST, "digest": d_child, "size": len(child)}]}
    data = json.dumps(index).encode()
    d_index = store.put_manifest(unique_repo, "multi", data, OCI_INDEX)
    got = store.get_manifest(unique_repo, "multi")
    assert (got.digest, got.media_type) == (d_index, OCI_INDEX)
    missing = dict(index, manifests=[{"mediaType": OCI_MANIFEST, "digest": digest_of(b"nope"), "size": 4}])
    with pytest.raises(ManifestNotFound):
        store.put_manifest(unique_repo, "broken", json.dumps(missing).encode(), OCI_INDEX)


def test_invalid_manifest_rejected(store, unique_repo):
    with pytest.raises(InvalidRequest):
        store.put_manifest(unique_repo, "x", b"not json", OCI_MANIFEST)
    with pytest.raises(InvalidRequest):
        store.put_manifest(unique_repo, "x", b"{}", "text/plain")
    with pytest.raises(InvalidRequest):
        store.put_manifest(unique_repo, "bad tag!", b"{}", OCI_MANIFEST)


def test_missing_manifest_is_typed(store, unique_repo):
    with pytest.raises(ManifestNotFound):
        store.get_manifest(unique_repo, "nope")
    with pytest.raises(ManifestNotFound):
        store.get_manifest(unique_repo, digest_of(b"nope"))
    assert store.list_tags(unique_repo) == []


def test_repositories_and_tags(store, unique_repo):
    repos = [unique_repo + "/a", unique_repo + "/b"]
    for i, repo in enumerate(repos):
        data = image_manifest(store, repo, [f"layer {i}".encode()])
        for tag in ("2", "1", "10"):
            store.put_manifest(repo, tag, data, OCI_MANIFEST)
    listed = store.list_repositories()
    assert listed == sorted(listed)
    assert set(repos) <= set(listed)
    assert store.list_tags(repos[0]) == ["1", "10", "2"]


# -- BlobSource over a store ---------------------------------------------------------------


def test_store_blob_source(store, unique_repo):
    data = os.urandom(70_000)
    d = digest_of(data)
    store.put_blob(unique_repo, d, data)
    src = StoreBlobSource(store, unique_repo, d)
    assert src.size() == len(data)
    assert src.size() == len(data)
    assert src.requests == 1  # size asked once
    assert src.read_at(65_536, 4464) == data[65_536:]
    assert (src.requests, src.bytes_read) == (2, 4464)


# -- deletion ------------------------------------------------------------------------------


def test_delete_manifest_removes_its_tags(store, unique_repo):
    keep = image_manifest(store, unique_repo, [b"keep"])
    drop = image_manifest(store, unique_repo, [b"drop"])
    d_keep = store.put_manifest(unique_repo, "keep", keep, OCI_MANIFEST)
    d_drop = store.put_manifest(unique_repo, "a", drop, OCI_MANIFEST)
    store.put_manifest(unique_repo, "b", drop, OCI_MANIFEST)
    store.delete_manifest(unique_repo, d_drop)
    assert store.list_tags(unique_repo) == ["keep"]
    assert not store.has_manifest(unique_repo, d_drop)
    with pytest.raises(ManifestNotFound):
        store.get_manifest(unique_repo, "a")
    assert store.get_manifest(unique_repo, "keep").digest == d_keep
    with pytest.raises(ManifestNotFound):
        store.delete_manifest(unique_repo, d_drop)


def test_delete_blob_unlinks_from_one_repository(store, unique_repo):
    data = os.urandom(2000)
    d = digest_of(data)
    other = unique_repo + "-keeps"
    store.put_blob(unique_repo, d, data)
    store.put_blob(other, d, data)
    store.delete_blob(unique_repo, d)
    assert not store.has_blob(unique_repo, d)
    with pytest.raises(BlobNotFound):
        store.read_blob(unique_repo, d, 0, 10)
    assert store.read_blob(other, d, 0, 10) == data[:10]
    with pytest.raises(BlobNotFound):
        store.delete_blob(unique_repo, d)
    assert store.put_blob(unique_repo, d, data) in (True, False)  # can come back
    assert store.read_blob(unique_repo, d, 5, 5) == data[5:10]
