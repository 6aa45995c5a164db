"""Per-environment accounting (by cgroup), access traces, background fill, peers."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest
from lazystore_fixtures import FILES, build_tree, publish, run_in

pytestmark = pytest.mark.integration


def drop_page_cache() -> None:
    Path("/proc/sys/vm/drop_caches").write_text("3")


def test_reads_are_attributed_and_traces_prefetch(tmp_path, oci_store, lazy_factory, env_cgroups):
    tree = build_tree(tmp_path / "src")
    digest = publish(oci_store, tree, tmp_path / "layer.blob", "test/envs")
    refs = [{"repo": "test/envs", "digest": digest}]
    lazy = lazy_factory(oci_store.url, neighbor_bytes=0)
    top = lazy.layer_dir(digest)
    argv = ["cat", *[str(top / f) for f in FILES]]
    want = b"".join((tree / f).read_bytes() for f in FILES)
    key = f"stack+task-{uuid.uuid4().hex[:6]}"

    e1 = f"e1-{uuid.uuid4().hex[:6]}"
    lazy.begin_env(e1, refs, trace_key=key, background=False)
    assert run_in(env_cgroups(e1), argv) == want
    (top / "etc/hostname").read_bytes()  # a read outside any environment: node-wide only
    s1 = lazy.end_env(e1)
    assert s1["read_bytes"]["registry"] + s1["read_bytes"]["memory"] == len(want)
    assert s1["critical_path_bytes"] > 0 and s1["fetched_bytes"] > 0 and s1["stall_seconds"] > 0

    lazy.drop_caches()
    drop_page_cache()
    e2 = f"e2-{uuid.uuid4().hex[:6]}"
    began = lazy.begin_env(e2, refs, trace_key=key, background=False)
    assert began["trace_prefetch_chunks"] >= len(FILES)
    for _ in range(100):  # the prefetch runs in the background; wait for it
        if lazy.env_stats(e2)["prefetch_bytes"] >= s1["critical_path_bytes"] and lazy.stats()["fetch"]["inflight"] == 0:
            break
        time.sleep(0.05)
    assert run_in(env_cgroups(e2), argv) == want
    s2 = lazy.end_env(e2)
    assert s2["critical_path_bytes"] == 0
    assert s2["from_cache_bytes"] == len(want)


def stored_chunk_bytes(blob: Path) -> int:
    """Stored bytes of every distinct chunk of a layer blob: what a complete fill transfers."""
    from rollstack.format.reader import open_toc
    from rollstack.format.source import FileBlobSource

    chunks = {c.blob_offset: c.blob_size for e in open_toc(FileBlobSource(blob)).entries for c in e.chunks}
    return sum(chunks.values())


def test_background_fill_fetches_the_rest(tmp_path, oci_store, lazy_factory):
    tree = build_tree(tmp_path / "src")
    digest = publish(oci_store, tree, tmp_path / "layer.blob", "test/fill")
    lazy = lazy_factory(oci_store.url, background_grace=0.0)
    env = f"fill-{uuid.uuid4().hex[:6]}"
    lazy.begin_env(env, [{"repo": "test/fill", "digest": digest}], background=True)
    total = stored_chunk_bytes(tmp_path / "layer.blob")
    for _ in range(200):  # "no fetch in flight" also holds between two fill requests: wait for all bytes
        if lazy.env_stats(env)["background_bytes"] >= total and lazy.stats()["fetch"]["inflight"] == 0:
            break
        time.sleep(0.05)
    before = lazy.stats()["fetch"]["transferred_bytes"].get("registry", 0)
    assert before > 0
    (lazy.layer_dir(digest) / "big.bin").read_bytes()  # everything is local now
    assert lazy.stats()["fetch"]["transferred_bytes"].get("registry", 0) == before
    lazy.end_env(env)


def test_background_fill_pauses_while_foreground_reads_run(tmp_path, oci_store, lazy_factory):
    """The mechanism, counted in bytes and requests: while a program keeps missing (serial
    demand reads, like imports), background fill moves at most the one request that was already
    in flight; it resumes once reads go quiet and then completes the layer."""
    src = tmp_path / "src"
    for i in range(300):  # one demand miss each (neighbour windows off)
        d = src / f"pkg{i // 20:02d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"mod{i:03d}.py").write_bytes(os.urandom(6000))
    (src / "aa-big.bin").write_bytes(os.urandom(24 << 20))  # what the fill has to fetch
    digest = publish(oci_store, src, tmp_path / "layer.blob", "test/gate")
    from rollstack.format.convert import DEFAULT_CHUNK_SIZE
    in_flight = max(1 << 20, DEFAULT_CHUNK_SIZE) + (64 << 10)  # one request (>= one whole chunk), compressed
    lazy = lazy_factory(oci_store.url, neighbor_bytes=0, neighbor_back_bytes=0, background_grace=0.0,
                        background_quiet=0.3, background_share=0.0)
    env = f"gate-{uuid.uuid4().hex[:6]}"
    ref = {"repo": "test/gate", "digest": digest}
    lazy.add_layers([ref])
    root = lazy.layer_dir(digest)
    files = sorted(root.glob("pkg*/mod*.py"), reverse=True)
    for f in files[:20]:  # the program is already missing when the environment is registered
        assert len(f.read_bytes()) == 6000
    lazy.begin_env(env, [ref], background=True)
    t0 = lazy.stats()["fetch"]["transferred_bytes"]
    for f in files[20:]:
        assert len(f.read_bytes()) == 6000
    t1 = lazy.stats()["fetch"]["transferred_bytes"]
    during = t1.get("background", 0) - t0.get("background", 0)
    assert t1.get("foreground", 0) - t0.get("foreground", 0) >= 250 * 6000  # the burst really missed
    assert during <= in_flight, f"background moved {during} bytes during the foreground burst"
    for _ in range(300):
        bg = lazy.stats()["background"]
        if lazy.env_stats(env)["background_bytes"] >= 24 << 20 and lazy.stats()["fetch"]["inflight"] == 0:
            break
        time.sleep(0.05)
    assert lazy.env_stats(env)["background_bytes"] >= 24 << 20  # resumed after the burst and finished
    assert bg["paused"] >= 1 and bg["started_during_foreground"] == 0
    before = lazy.stats()["fetch"]["transferred_bytes"].get("registry", 0)
    assert (root / "aa-big.bin").stat().st_size == 24 << 20
    (root / "aa-big.bin").read_bytes()
    assert lazy.stats()["fetch"]["transferred_bytes"].get("registry", 0) == before
    lazy.end_env(env)


def test_peer_serves_chunks_and_dead_peer_falls_through(tmp_path, oci_store, lazy_factory):
    from rollstack.store.server import free_port

    tree = build_tree(tmp_path / "src")
    digest = publish(oci_store, tree, tmp_path / "layer.blob", "test/peers")
    ref = {"repo": "test/peers", "digest": digest}
    port = free_port()
    a = lazy_factory(oci_store.url, name="a", listen=f"127.0.0.1:{port}")
    a.add_layers([ref])
    want = (a.layer_dir(digest) / "big.bin").read_bytes()
    time.sleep(0.2)
    dead = f"http://127.0.0.1:{free_port()}"
    b = lazy_factory(oci_store.url, name="b", peers=[dead, f"http://127.0.0.1:{port}"])
    b.add_layers([ref])
    assert (b.layer_dir(digest) / "big.bin").read_bytes() == want
    fb = b.stats()["fetch"]
    assert fb["served_bytes"]["peer"] > 0
    assert fb["served_bytes"]["registry"] == 0
    # a chunk no peer has still comes from the registry
    assert (b.layer_dir(digest) / "etc/hostname").read_bytes() == (tree / "etc/hostname").read_bytes()


def test_fetch_all_makes_the_stack_local(tmp_path, oci_store, lazy_factory):
    tree = build_tree(tmp_path / "src")
    digest = publish(oci_store, tree, tmp_path / "layer.blob", "test/eager")
    ref = {"repo": "test/eager", "digest": digest}
    lazy = lazy_factory(oci_store.url)
    doc = lazy.fetch_all([ref])
    assert doc["fetched_bytes"] > 0 and doc["stack_bytes"] == (tmp_path / "layer.blob").stat().st_size
    before = lazy.stats()["fetch"]["transferred_bytes"]["registry"]
    for rel in FILES:
        assert (lazy.layer_dir(digest) / rel).read_bytes() == (tree / rel).read_bytes()
    assert lazy.stats()["fetch"]["transferred_bytes"]["registry"] == before
    assert lazy.fetch_all([ref])["fetched_bytes"] == 0  # already local


def test_fetch_all_in_the_background_makes_the_stack_local_as_gated_fill(tmp_path, oci_store, lazy_factory):
    tree = build_tree(tmp_path / "src")
    digest = publish(oci_store, tree, tmp_path / "layer.blob", "test/eager-bg")
    ref = {"repo": "test/eager-bg", "digest": digest}
    lazy = lazy_factory(oci_store.url, background_quiet=0.0, background_share=0.0)
    doc = lazy.fetch_all([ref], background=True)
    moved = lazy.stats()["fetch"]["transferred_bytes"]
    assert doc["fetched_bytes"] > 0 and moved.get("background", 0) == moved["registry"]  # all of it as fill
    assert lazy.stats()["background"]["admitted"] >= 1
    for rel in FILES:
        assert (lazy.layer_dir(digest) / rel).read_bytes() == (tree / rel).read_bytes()
    assert lazy.stats()["fetch"]["transferred_bytes"]["registry"] == moved["registry"]
