"""Environments' trace work (lazystore/envs.py) on a real service and a real OCI layout store, without
FUSE: a create never waits for the shared-trace lookup, the recording decision stays right, and
an environment's tasks (trace prefetch, lookups, background fill) all run."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio

from rollstack.errors import NotFound
from rollstack.fetch import TraceChunk, shared_traces
from rollstack.format import convert
from rollstack.lazystore.config import DaemonConfig
from rollstack.lazystore.service import LazyStoreService
from rollstack.store.ocilayout import OciLayoutStore


class GatedStore:
    """The real store, except that trace manifests are answered only once `gate` is set."""

    def __init__(self, store: OciLayoutStore) -> None:
        self.inner, self.gate, self.asked = store, threading.Event(), 0

    def get_manifest(self, repo: str, ref: str):
        if repo == shared_traces.REPO:
            self.asked += 1
            assert self.gate.wait(30), "test never opened the gate"
        return self.inner.get_manifest(repo, ref)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


@pytest.fixture
def layer(tmp_path: Path):
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    for i in range(4):
        (src / "d" / f"f{i}").write_bytes(bytes([i]) * (300_000 + i))
    store = OciLayoutStore(tmp_path / "oci")
    blob = tmp_path / "layer.blob"
    info = convert(src, blob)
    store.put_blob("t/envs", info.digest, blob)
    try:
        yield store, {"repo": "t/envs", "digest": info.digest}
    finally:
        store.close()


def service(tmp_path: Path, store, name: str, **kw) -> LazyStoreService:
    return LazyStoreService(DaemonConfig.of(tmp_path / name / "mnt", tmp_path / name / "state", "oci:x", **kw), store)


async def until(pred, seconds: float = 20.0) -> None:
    with trio.fail_after(seconds):
        while not pred():
            await trio.sleep(0.01)


def chunks_of(svc: LazyStoreService, ref: dict) -> list[TraceChunk]:
    layer = svc.layers.loaded(ref["digest"])
    return [TraceChunk(ref["digest"], c) for e in layer.index.toc for c in e.chunks]


def run(svc: LazyStoreService, ref: dict, body, local: dict[str, int] | None = None):
    """`body()` on a running service with the layer added and this node's traces `local`
    (key -> its first n chunks of the layer)."""
    async def main():
        async with svc.fetcher.running():
            await svc.add_layers([ref])
            for key, n in (local or {}).items():
                svc.traces.store.put(key, chunks_of(svc, ref)[:n], 100)
            return await body()

    return trio.run(main)


def test_create_does_not_wait_for_the_shared_lookup_and_a_late_task_trace_ends_the_recording(tmp_path, layer):
    store, ref = layer
    gated = GatedStore(store)
    svc = service(tmp_path, gated, "b", background_grace=0.0)

    async def body():
        shared_traces.publish(store, "stack/task", chunks_of(svc, ref)[:2])  # another node's
        began = await svc.begin_env("e1", [ref], trace_key="stack/task", fallback_key="stack", background=False)
        # returned while both lookups wait at the store
        assert began["trace_lookup"] == "pending" and began["trace_source"] is None
        assert svc.env_stats("e1")["trace_recording"]  # no task trace yet: record one
        await until(lambda: gated.asked == 2)  # the task's and the stack's, concurrently
        gated.gate.set()
        await until(lambda: svc.env_stats("e1")["trace_lookup"] == "done")
        st = svc.env_stats("e1")
        assert st["trace_source"] == "shared" and st["trace_prefetch_chunks"] == 2
        assert not st["trace_recording"]  # the task has a trace now: nothing to record
        await until(lambda: svc.env_stats("e1")["prefetch_bytes"] > 0)
        assert svc.stats()["shared_trace_hits"] == 1 and svc.stats()["shared_trace_misses"] == 1
        await svc.end_env("e1")
        return await svc.traces.local("stack/task")

    kept = run(svc, ref, body)
    assert len(kept) == 2  # the shared trace is kept locally (nothing recorded was merged in)


def test_a_local_task_trace_is_used_at_once_and_nothing_is_looked_up_or_recorded(tmp_path, layer):
    store, ref = layer
    gated = GatedStore(store)
    svc = service(tmp_path, gated, "a")

    async def body():
        began = await svc.begin_env("e1", [ref], trace_key="stack/task", background=False)
        assert began["trace_source"] == "local" and began["trace_lookup"] == "done"
        assert began["trace_prefetch_chunks"] == len(chunks_of(svc, ref))
        assert not svc.env_stats("e1")["trace_recording"]
        await svc.end_env("e1")

    run(svc, ref, body, {"stack/task": 1000})
    assert gated.asked == 0


def test_a_local_stack_trace_prefetches_while_the_task_lookup_misses_and_the_task_records(tmp_path, layer):
    store, ref = layer
    gated = GatedStore(store)
    svc = service(tmp_path, gated, "a")

    async def body():
        began = await svc.begin_env("e1", [ref], trace_key="stack/two", fallback_key="stack", background=False)
        assert began["trace_source"] == "stack-local" and began["trace_prefetch_chunks"] == 1
        assert began["trace_lookup"] == "pending"
        await until(lambda: svc.env_stats("e1")["prefetch_bytes"] > 0)  # not held up by the lookup
        gated.gate.set()
        await until(lambda: svc.env_stats("e1")["trace_lookup"] == "done")
        st = svc.env_stats("e1")
        assert st["trace_source"] == "stack-local" and st["trace_recording"]
        assert svc.stats()["shared_trace_misses"] == 1  # only the task's: the stack's is here

    run(svc, ref, body, {"stack": 1})
    assert gated.asked == 1


def test_an_environment_with_a_trace_also_gets_its_background_fill(tmp_path, layer):
    """Regression: all of an environment's tasks shared one CancelScope, which trio lets be
    entered once, so of a trace prefetch and the background fill, the second to start failed."""
    store, ref = layer
    svc = service(tmp_path, store, "a", background_grace=0.0, background_quiet=0.0, background_share=0.0)

    async def body():
        began = await svc.begin_env("e1", [ref], trace_key="k", background=True)
        assert began["trace_source"] == "local"
        await until(lambda: svc.env_stats("e1")["background_bytes"] > 0 and svc.env_stats("e1")["prefetch_bytes"] > 0)
        assert not [e for e in svc.stats()["fetch"]["events"] if e["type"] == "background_error"]
        st = await svc.end_env("e1")
        with pytest.raises(NotFound, match="not known"):
            svc.env_stats("e1")
        return st

    assert run(svc, ref, body, {"k": 1})["trace_source"] == "local"


def test_a_task_trace_after_the_stack_trace_prefetches_only_the_chunks_not_asked_for_yet(tmp_path, layer):
    store, ref = layer
    gated = GatedStore(store)
    svc = service(tmp_path, gated, "c")

    async def body():
        every = chunks_of(svc, ref)
        assert len(every) >= 3
        shared_traces.publish(store, "stack/task", every[:3])  # overlaps the local stack trace's 2
        began = await svc.begin_env("e1", [ref], trace_key="stack/task", fallback_key="stack", background=False)
        assert began["trace_source"] == "stack-local" and began["trace_prefetch_chunks"] == 2
        gated.gate.set()
        await until(lambda: svc.env_stats("e1")["trace_lookup"] == "done")
        st = svc.env_stats("e1")
        assert st["trace_source"] == "shared" and st["trace_prefetch_chunks"] == 3  # 2 + 1 new, not 2 + 3
        assert svc.envs.envs["e1"].prefetched == {t.key for t in every[:3]}

    run(svc, ref, body, {"stack": 2})
