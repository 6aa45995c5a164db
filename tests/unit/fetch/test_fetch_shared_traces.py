"""Shared access traces: encoding, artifact layout, validation of untrusted store content."""

from __future__ import annotations

import json

import pytest

from rollstack.errors import InvalidRequest
from rollstack.fetch import shared_traces as st
from rollstack.store.names import check_tag, manifest_references

L1 = "sha256:" + "a" * 64
L2 = "sha256:" + "b" * 64
D = "sha256:" + "c" * 64
LAYERS = {L1: 10_000, L2: 5_000}


def chunk(bo: int, bs: int = 100, **kw) -> dict:
    return dict({"o": bo * 2, "s": bs * 2, "bo": bo, "bs": bs, "d": D, "c": "zstd"}, **kw)


def encode(doc) -> bytes:
    return json.dumps(doc).encode()


def test_round_trip_keeps_order_and_drops_duplicates():
    entries = [(L2, chunk(0)), (L1, chunk(200)), (L1, chunk(0)), (L1, chunk(200))]
    out = st.decode_trace(st.encode_trace("k", entries), "k", LAYERS)
    assert out == [(L2, chunk(0)), (L1, chunk(200)), (L1, chunk(0))]


def test_tag_is_a_valid_tag_and_depends_on_the_key():
    assert check_tag(st.trace_tag("stack+task/with spaces:and colons"))
    assert st.trace_tag("a") != st.trace_tag("b") and len(st.trace_tag("a")) == 64


def test_artifact_manifest_references_its_blobs():
    config, blob, manifest = st.build_artifact("k", [(L1, chunk(0))])
    blobs, children = manifest_references(manifest, st.OCI_MANIFEST)
    assert set(blobs) == {st._sha(config), st._sha(blob)} and children == []
    assert st.trace_blob_descriptor(manifest) == (st._sha(blob), len(blob))


@pytest.mark.parametrize("data", [
    b"not json", b"[]", b"{\"v\": 2, \"key\": \"k\", \"chunks\": []}",
    encode({"v": 1, "key": "other", "chunks": []}),
    encode({"v": 1, "key": "k", "chunks": {}}),
    encode({"v": 1, "key": "k", "chunks": [[L1]]}),
    encode({"v": 1, "key": "k", "chunks": [[L1, "x"]]}),
    encode({"v": 1, "key": "k", "chunks": [["sha256:" + "f" * 64, chunk(0)]]}),  # layer not in the stack
    encode({"v": 1, "key": "k", "chunks": [[L2, chunk(4950)]]}),  # beyond the blob
    encode({"v": 1, "key": "k", "chunks": [[L1, chunk(-1)]]}),
    encode({"v": 1, "key": "k", "chunks": [[L1, chunk(0, bs=0)]]}),
    encode({"v": 1, "key": "k", "chunks": [[L1, chunk(0, c="lz9")]]}),
    encode({"v": 1, "key": "k", "chunks": [[L1, chunk(0, d="../../etc/passwd")]]}),
    encode({"v": 1, "key": "k", "chunks": [[L1, dict(chunk(0), bo=True)]]}),
    encode({"v": 1, "key": "k", "chunks": [[L1, chunk(0, s="100")]]}),
    encode({"v": 1, "key": "k", "chunks": [[L1, chunk(0)]] * (st.MAX_ENTRIES + 1)}),
    b"[" * 100_000,
    b" " * (st.MAX_TRACE_BYTES + 1),
])
def test_hostile_traces_are_rejected(data):
    with pytest.raises(InvalidRequest):
        st.decode_trace(data, "k", LAYERS)


@pytest.mark.parametrize("manifest", [
    b"{", b"[]", encode({"layers": []}),
    encode({"layers": [{"mediaType": "application/octet-stream", "digest": D, "size": 10}]}),
    encode({"layers": [{"mediaType": st.TRACE_MEDIA_TYPE, "digest": D, "size": st.MAX_TRACE_BYTES + 1}]}),
    encode({"layers": [{"mediaType": st.TRACE_MEDIA_TYPE, "digest": "sha256:zz", "size": 10}]}),
])
def test_bad_manifests_are_rejected(manifest):
    with pytest.raises(InvalidRequest):
        st.trace_blob_descriptor(manifest)


def test_publish_and_lookup_through_a_store(tmp_path):
    from rollstack.store.ocilayout import OciLayoutStore

    store = OciLayoutStore(tmp_path / "store")
    try:
        assert st.lookup(store, "k", LAYERS) is None
        st.publish(store, "k", [(L1, chunk(0)), (L2, chunk(100))])
        assert st.lookup(store, "k", LAYERS) == [(L1, chunk(0)), (L2, chunk(100))]
        with pytest.raises(InvalidRequest):  # a different stack cannot use it
            st.lookup(store, "k", {L1: 10_000})
        assert st.lookup(store, "other", LAYERS) is None
    finally:
        store.close()


class _SlowStore:
    url = "fake:"

    def __init__(self, delay: float = 0.0, fail: bool = False) -> None:
        self.delay, self.fail = delay, fail

    def get_manifest(self, repo, ref):
        import time

        time.sleep(self.delay)
        if self.fail:
            raise OSError("store unreachable")
        from rollstack.errors import ManifestNotFound

        raise ManifestNotFound("no such trace")


@pytest.mark.parametrize("store, counter", [(_SlowStore(delay=2.0), "errors"), (_SlowStore(fail=True), "errors"),
                                            (_SlowStore(), "misses")])
def test_service_lookup_is_best_effort_and_bounded(tmp_path, monkeypatch, store, counter):
    import trio

    from rollstack.mount import service as svc_mod

    monkeypatch.setattr(svc_mod, "SHARED_TRACE_TIMEOUT", 0.2)
    svc = svc_mod.LazyStoreService(svc_mod.DaemonConfig(tmp_path / "mnt", tmp_path / "state", "fake:"), store)
    layers = [{"digest": L1, "blob_size": 10_000}]
    assert trio.run(svc._shared_trace, "k", layers) == []  # noqa: SLF001
    assert svc.stats()[f"shared_trace_{counter}"] == 1
