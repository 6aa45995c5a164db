"""Property tests over both stores: random range reads equal slices; random tag histories
behave like a dict (tag -> last manifest) while every manifest stays reachable by digest."""

from __future__ import annotations

import hashlib
import json
import os
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollstack.store.names import OCI_MANIFEST

pytestmark = pytest.mark.integration
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
DATA = os.urandom(50_000)
DIGEST = "sha256:" + hashlib.sha256(DATA).hexdigest()


@SETTINGS
@given(offset=st.integers(0, 60_000), length=st.integers(0, 60_000))
def test_random_ranges_equal_slices(store, offset, length):
    store.put_blob("prop/ranges", DIGEST, DATA)  # uploads once, then a no-op
    assert store.read_blob("prop/ranges", DIGEST, offset, length) == DATA[offset:offset + length]


def _manifest(store, repo: str, i: int) -> bytes:
    layer = f"layer {i}".encode()
    for blob in (b"{}", layer):
        store.put_blob(repo, "sha256:" + hashlib.sha256(blob).hexdigest(), blob)
    return json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": "sha256:" + hashlib.sha256(b"{}").hexdigest(), "size": 2},
        "layers": [{"mediaType": "application/vnd.rollstack.layer.v1", "digest": "sha256:" + hashlib.sha256(layer).hexdigest(), "size": len(layer)}],
    }).encode()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(["a", "b", "c", None]), st.integers(0, 3)), min_size=1, max_size=12))
def test_tag_history_behaves_like_a_dict(store, ops):
    repo = f"prop/{uuid.uuid4().hex[:10]}"
    model: dict[str, str] = {}
    pushed: set[str] = set()
    for tag, i in ops:
        data = _manifest(store, repo, i)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        assert store.put_manifest(repo, tag or digest, data, OCI_MANIFEST) == digest
        pushed.add(digest)
        if tag:
            model[tag] = digest
    assert store.list_tags(repo) == sorted(model)
    for tag, digest in model.items():
        assert store.get_manifest(repo, tag).digest == digest
    for digest in pushed:
        assert store.has_manifest(repo, digest)
