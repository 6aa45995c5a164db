"""Shared access traces: encoding, artifact layout, validation of untrusted store content."""

from __future__ import annotations

import json

import pytest

from rollstack.errors import InvalidRequest
from rollstack.fetch import TraceChunk
from rollstack.fetch import shared_traces as st
from rollstack.store.names import check_tag, manifest_references

L1 = "sha256:" + "a" * 64
L2 = "sha256:" + "b" * 64
D = "sha256:" + "c" * 64
LAYERS = {L1: 10_000, L2: 5_000}


def chunk(bo: int, bs: int = 100, **kw) -> dict:
    """A chunk's document form (what travels and is stored)."""
    return dict({"o": bo * 2, "s": bs * 2, "bo": bo, "bs": bs, "d": D, "c": "zstd"}, **kw)


def entry(layer: str, bo: int, bs: int = 100) -> TraceChunk:
    return TraceChunk.from_doc([layer, chunk(bo, bs)])


def encode(doc) -> bytes:
    return json.dumps(doc).encode()


def test_round_trip_keeps_order_and_drops_duplicates():
    entries = [entry(L2, 0), entry(L1, 200), entry(L1, 0), entry(L1, 200)]
    out = st.decode_trace(st.encode_trace("k", entries), "k", LAYERS)
    assert out == [entry(L2, 0), entry(L1, 200), entry(L1, 0)]
    assert out[0].to_doc() == [L2, chunk(0)]  # the document form is unchanged


def test_tag_is_a_valid_tag_and_depends_on_the_key():
    assert check_tag(st.trace_tag("stack+task/with spaces:and colons"))
    assert st.trace_tag("a") != st.trace_tag("b") and len(st.trace_tag("a")) == 64


def test_artifact_manifest_references_its_blobs():
    config, blob, manifest = st.build_artifact("k", [entry(L1, 0)])
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
        st.publish(store, "k", [entry(L1, 0), entry(L2, 100)])
        assert st.lookup(store, "k", LAYERS) == [entry(L1, 0), entry(L2, 100)]
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

    from rollstack.lazystore import traces as traces_mod
    from rollstack.lazystore.config import DaemonConfig
    from rollstack.lazystore.service import LazyStoreService

    monkeypatch.setattr(traces_mod, "SHARED_TRACE_TIMEOUT", 0.2)
    svc = LazyStoreService(DaemonConfig.of(tmp_path / "mnt", tmp_path / "state", "fake:"), store)
    assert trio.run(svc.traces.shared_trace, "k", {L1: 10_000}) == []
    assert svc.stats()[f"shared_trace_{counter}"] == 1
