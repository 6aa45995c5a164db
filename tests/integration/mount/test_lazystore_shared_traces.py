"""Access traces shared through the artifact store: a cold node prefetches what another recorded."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from lazystore_fixtures import build_tree, publish

from rollstack.fetch import shared_traces
from rollstack.mount.client import LazyStoreClient

pytestmark = pytest.mark.integration

CGROUP_ROOT = Path("/sys/fs/cgroup/pids")
FILES = ["usr/lib/python3/json/decoder.py", "usr/lib/python3/json/encoder.py", "usr/lib/python3/email/parser.py",
         "usr/lib/python3/logging/__init__.py", "big.bin"]


@pytest.fixture
def nodes(tmp_path: Path):
    started: list[LazyStoreClient] = []

    def start(store_url: str, name: str, **kw) -> LazyStoreClient:
        c = LazyStoreClient.start(tmp_path / name / "mnt", tmp_path / name / "state", store_url, **kw)
        started.append(c)
        return c

    try:
        yield start
    finally:
        for c in reversed(started):
            c.stop()


@pytest.fixture
def cgroups():
    """Creates cgroups `rollstack/<id>` (pids controller, v1) and removes them afterwards."""
    if not (CGROUP_ROOT / "cgroup.procs").exists():
        pytest.skip("no cgroup v1 pids hierarchy on this host")
    made: list[Path] = []

    def make(env_id: str) -> Path:
        path = CGROUP_ROOT / "rollstack" / env_id
        path.mkdir(parents=True, exist_ok=True)
        made.append(path)
        return path

    try:
        yield make
    finally:
        for p in made:
            for _ in range(50):
                try:
                    p.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)


def run_in(cgroup: Path, argv: list[str]) -> bytes:
    def enter() -> None:
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))

    return subprocess.run(argv, preexec_fn=enter, check=True, capture_output=True).stdout


def wait_for(pred, tries: int = 200) -> None:
    for _ in range(tries):
        if pred():
            return
        time.sleep(0.05)


def test_a_cold_node_prefetches_a_trace_another_node_published(tmp_path, oci_store, nodes, cgroups):
    tree = build_tree(tmp_path / "src")
    digest = publish(oci_store, tree, tmp_path / "layer.blob", "test/shared")
    refs = [{"repo": "test/shared", "digest": digest}]
    want = b"".join((tree / f).read_bytes() for f in FILES)
    key = f"stack+task-{uuid.uuid4().hex[:6]}"

    a = nodes(oci_store.url, "a", neighbor_bytes=0)
    ea = f"a-{uuid.uuid4().hex[:6]}"
    began = a.begin_env(ea, refs, trace_key=key, background=False)
    assert began["trace_source"] is None and a.stats()["shared_trace_misses"] == 1
    assert run_in(cgroups(ea), ["cat", *[str(a.layer_dir(digest) / f) for f in FILES]]) == want
    sa = a.end_env(ea)
    assert sa["critical_path_bytes"] > 0
    wait_for(lambda: a.stats()["shared_traces_published"] == 1)
    assert a.stats()["shared_traces_published"] == 1
    assert oci_store.has_manifest(shared_traces.REPO, shared_traces.trace_tag(key))

    b = nodes(oci_store.url, "b", neighbor_bytes=0)  # fresh state dir: no local trace, empty cache
    eb = f"b-{uuid.uuid4().hex[:6]}"
    began = b.begin_env(eb, refs, trace_key=key, background=False)
    assert began["trace_source"] == "shared" and began["trace_prefetch_chunks"] >= len(FILES)
    assert b.stats()["shared_trace_hits"] == 1
    wait_for(lambda: b.env_stats(eb)["prefetch_bytes"] >= sa["critical_path_bytes"]
             and b.stats()["fetch"]["inflight"] == 0)
    assert run_in(cgroups(eb), ["cat", *[str(b.layer_dir(digest) / f) for f in FILES]]) == want
    sb = b.end_env(eb)
    assert sb["prefetch_bytes"] > 0
    assert sb["critical_path_bytes"] == 0  # every read was served by the shared-trace prefetch
    assert sb["from_cache_bytes"] == len(want)


def test_a_corrupt_shared_trace_is_ignored(tmp_path, oci_store, nodes, cgroups):
    tree = build_tree(tmp_path / "src", big_mib=1)
    digest = publish(oci_store, tree, tmp_path / "layer.blob", "test/shared2")
    refs = [{"repo": "test/shared2", "digest": digest}]
    key = f"stack+task-{uuid.uuid4().hex[:6]}"
    junk = b'{"v": 1, "key": "%s", "chunks": [["sha256:%s", {"bo": -5}]]}' % (key.encode(), b"f" * 64)
    _, _, manifest = shared_traces.build_artifact(key, [])
    blob_digest = shared_traces._sha(junk)  # noqa: SLF001
    config = b'{"chunks":0,"v":1}'
    oci_store.put_blob(shared_traces.REPO, shared_traces._sha(config), config)  # noqa: SLF001
    oci_store.put_blob(shared_traces.REPO, blob_digest, junk)
    import json

    doc = json.loads(manifest)
    doc["layers"][0].update(digest=blob_digest, size=len(junk))
    oci_store.put_manifest(shared_traces.REPO, shared_traces.trace_tag(key), json.dumps(doc).encode(),
                           shared_traces.OCI_MANIFEST)

    b = nodes(oci_store.url, "b", neighbor_bytes=0)
    env = f"c-{uuid.uuid4().hex[:6]}"
    began = b.begin_env(env, refs, trace_key=key, background=False)
    assert began["trace_source"] is None and began["trace_prefetch_chunks"] == 0
    assert b.stats()["shared_trace_errors"] == 1 and b.stats()["shared_trace_hits"] == 0
    f = FILES[0]
    assert run_in(cgroups(env), ["cat", str(b.layer_dir(digest) / f)]) == (tree / f).read_bytes()
    b.end_env(env)


def test_sharing_can_be_turned_off(tmp_path, oci_store, nodes, cgroups):
    tree = build_tree(tmp_path / "src", big_mib=1)
    digest = publish(oci_store, tree, tmp_path / "layer.blob", "test/shared3")
    key = f"stack+task-{uuid.uuid4().hex[:6]}"
    b = nodes(oci_store.url, "b", share_traces=False)
    env = f"d-{uuid.uuid4().hex[:6]}"
    b.begin_env(env, [{"repo": "test/shared3", "digest": digest}], trace_key=key, background=False)
    run_in(cgroups(env), ["cat", str(b.layer_dir(digest) / FILES[0])])
    assert b.end_env(env)["critical_path_bytes"] > 0  # a trace was recorded (locally only)
    time.sleep(0.3)
    s = b.stats()
    assert s["shared_trace_misses"] == 0 and s["shared_traces_published"] == 0
    assert not oci_store.has_manifest(shared_traces.REPO, shared_traces.trace_tag(key))
