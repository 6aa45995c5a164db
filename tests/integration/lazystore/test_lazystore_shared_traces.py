"""Access traces shared through the artifact store: a cold node prefetches what another recorded."""

from __future__ import annotations

import time
import uuid

import pytest
from lazystore_fixtures import FILES, build_tree, publish, run_in

from rollstack.fetch import shared_traces

pytestmark = pytest.mark.integration


def wait_for(pred, tries: int = 200) -> None:
    for _ in range(tries):
        if pred():
            return
        time.sleep(0.05)


def looked_up(lazy, env_id: str) -> dict:
    """The environment's stats once its shared-trace lookup (in the background) answered."""
    wait_for(lambda: lazy.env_stats(env_id)["trace_lookup"] == "done")
    return lazy.env_stats(env_id)


def test_a_cold_node_prefetches_a_trace_another_node_published(tmp_path, oci_store, lazy_factory, env_cgroups):
    tree = build_tree(tmp_path / "src")
    digest = publish(oci_store, tree, tmp_path / "layer.blob", "test/shared")
    refs = [{"repo": "test/shared", "digest": digest}]
    want = b"".join((tree / f).read_bytes() for f in FILES)
    key = f"stack+task-{uuid.uuid4().hex[:6]}"

    a = lazy_factory(oci_store.url, "a", neighbor_bytes=0)
    ea = f"a-{uuid.uuid4().hex[:6]}"
    began = a.begin_env(ea, refs, trace_key=key, background=False)
    assert began["trace_source"] is None and began["trace_lookup"] == "pending"  # create did not wait
    assert looked_up(a, ea)["trace_source"] is None and a.stats()["shared_trace_misses"] == 1
    assert run_in(env_cgroups(ea), ["cat", *[str(a.layer_dir(digest) / f) for f in FILES]]) == want
    sa = a.end_env(ea)
    assert sa["critical_path_bytes"] > 0
    wait_for(lambda: a.stats()["shared_traces_published"] == 1)
    assert a.stats()["shared_traces_published"] == 1
    assert oci_store.has_manifest(shared_traces.REPO, shared_traces.trace_tag(key))

    b = lazy_factory(oci_store.url, "b", neighbor_bytes=0)  # fresh state dir: no local trace, empty cache
    eb = f"b-{uuid.uuid4().hex[:6]}"
    b.begin_env(eb, refs, trace_key=key, background=False)
    began = looked_up(b, eb)
    assert began["trace_source"] == "shared" and began["trace_prefetch_chunks"] >= len(FILES)
    assert b.stats()["shared_trace_hits"] == 1
    assert not began["trace_recording"]  # the task has a trace: nothing recorded
    wait_for(lambda: b.env_stats(eb)["prefetch_bytes"] >= sa["critical_path_bytes"]
             and b.stats()["fetch"]["inflight"] == 0)
    assert run_in(env_cgroups(eb), ["cat", *[str(b.layer_dir(digest) / f) for f in FILES]]) == want
    sb = b.end_env(eb)
    assert sb["prefetch_bytes"] > 0
    assert sb["critical_path_bytes"] == 0  # every read was served by the shared-trace prefetch
    assert sb["from_cache_bytes"] == len(want)


def test_a_corrupt_shared_trace_is_ignored(tmp_path, oci_store, lazy_factory, env_cgroups):
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

    b = lazy_factory(oci_store.url, "b", neighbor_bytes=0)
    env = f"c-{uuid.uuid4().hex[:6]}"
    b.begin_env(env, refs, trace_key=key, background=False)
    began = looked_up(b, env)
    assert began["trace_source"] is None and began["trace_prefetch_chunks"] == 0
    assert b.stats()["shared_trace_errors"] == 1 and b.stats()["shared_trace_hits"] == 0
    f = FILES[0]
    assert run_in(env_cgroups(env), ["cat", str(b.layer_dir(digest) / f)]) == (tree / f).read_bytes()
    b.end_env(env)


def test_sharing_can_be_turned_off(tmp_path, oci_store, lazy_factory, env_cgroups):
    tree = build_tree(tmp_path / "src", big_mib=1)
    digest = publish(oci_store, tree, tmp_path / "layer.blob", "test/shared3")
    key = f"stack+task-{uuid.uuid4().hex[:6]}"
    b = lazy_factory(oci_store.url, "b", share_traces=False)
    env = f"d-{uuid.uuid4().hex[:6]}"
    began = b.begin_env(env, [{"repo": "test/shared3", "digest": digest}], trace_key=key, background=False)
    assert began["trace_lookup"] == "done"  # nothing to look up
    run_in(env_cgroups(env), ["cat", str(b.layer_dir(digest) / FILES[0])])
    assert b.end_env(env)["critical_path_bytes"] > 0  # a trace was recorded (locally only)
    time.sleep(0.3)
    s = b.stats()
    assert s["shared_trace_misses"] == 0 and s["shared_traces_published"] == 0
    assert not oci_store.has_manifest(shared_traces.REPO, shared_traces.trace_tag(key))


def test_a_new_task_on_a_known_stack_prefetches_the_stack_trace_and_records_its_own(
        tmp_path, oci_store, lazy_factory, env_cgroups):
    tree = build_tree(tmp_path / "src")
    digest = publish(oci_store, tree, tmp_path / "layer.blob", "test/stacktrace")
    refs = [{"repo": "test/stacktrace", "digest": digest}]
    want = b"".join((tree / f).read_bytes() for f in FILES)
    stack = f"stack-{uuid.uuid4().hex[:6]}"

    a = lazy_factory(oci_store.url, "a", neighbor_bytes=0)
    ea = f"a-{uuid.uuid4().hex[:6]}"
    a.begin_env(ea, refs, trace_key=f"{stack}/task/one", fallback_key=f"{stack}/stack", background=False)
    assert looked_up(a, ea)["trace_source"] is None
    assert a.stats()["shared_trace_misses"] == 2  # the task's and the stack's, concurrently
    assert run_in(env_cgroups(ea), ["cat", *[str(a.layer_dir(digest) / f) for f in FILES]]) == want
    a.end_env(ea)
    wait_for(lambda: a.stats()["shared_traces_published"] == 2)  # the task's trace and the stack's
    assert a.stats()["shared_traces_published"] == 2

    b = lazy_factory(oci_store.url, "b", neighbor_bytes=0)  # another node, another task of the stack
    eb = f"b-{uuid.uuid4().hex[:6]}"
    b.begin_env(eb, refs, trace_key=f"{stack}/task/two", fallback_key=f"{stack}/stack", background=False)
    began = looked_up(b, eb)
    assert began["trace_source"] == "stack-shared" and began["trace_prefetch_chunks"] >= len(FILES)
    assert b.env_stats(eb)["trace_recording"]  # task two gets a trace of its own
    wait_for(lambda: b.env_stats(eb)["prefetch_bytes"] > 0 and b.stats()["fetch"]["inflight"] == 0)
    assert run_in(env_cgroups(eb), ["cat", *[str(b.layer_dir(digest) / f) for f in FILES]]) == want
    assert b.end_env(eb)["critical_path_bytes"] == 0
    wait_for(lambda: b.stats()["shared_traces_published"] == 2)
    assert oci_store.has_manifest(shared_traces.REPO, shared_traces.trace_tag(f"{stack}/task/two"))
