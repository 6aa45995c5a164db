"""The lazy store against a real docker-registry: concurrency, registry death, corruption."""

from __future__ import annotations

import errno
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from lazystore_fixtures import build_tree, publish, read_errno, walk

from rollstack.format import FileBlobSource, LayerReader
from rollstack.store import RegistryServer, RegistryStore
from rollstack.store.server import free_port

pytestmark = pytest.mark.integration


def test_32_concurrent_readers_fetch_each_chunk_once(tmp_path, registry_store, lazy_factory, unique_repo):
    tree = build_tree(tmp_path / "src", big_mib=6)
    digest = publish(registry_store, tree, tmp_path / "layer.blob", unique_repo)
    lazy = lazy_factory(registry_store.url)
    lazy.add_layers([{"repo": unique_repo, "digest": digest}])
    top = lazy.layer_dir(digest)
    files = [p.relative_to(tree) for p in walk(tree) if p.is_file() and not p.is_symlink()]
    expected = {rel: (tree / rel).read_bytes() for rel in files}
    start = threading.Barrier(32)

    def reader(seed: int) -> int:
        order = files[:]
        random.Random(seed).shuffle(order)
        start.wait()
        bad = 0
        for rel in order[: len(order) // 2 + seed % 7]:
            if (top / rel).read_bytes() != expected[rel]:
                bad += 1
        return bad

    with ThreadPoolExecutor(32) as pool:
        assert sum(pool.map(reader, range(32))) == 0
    fetch = lazy.stats()["fetch"]
    assert fetch["chunks_fetched"] > 0
    assert fetch["chunks_fetched_more_than_once"] == 0
    # coalescing: fewer range GETs than chunks
    assert fetch["requests"]["registry"] < fetch["chunks_fetched"]


def test_registry_killed_mid_read_gives_eio_then_recovers(tmp_path, lazy_factory):
    port = free_port()
    server = RegistryServer(tmp_path / "reg", f"127.0.0.1:{port}").start()
    try:
        store = RegistryStore(server.url, retries=0)
        src = tmp_path / "src"
        (src / "d").mkdir(parents=True)
        big = os.urandom(24 << 20)
        (src / "big.bin").write_bytes(big)
        for i in range(20):
            (src / "d" / f"f{i}.txt").write_bytes(os.urandom(200_000))
        digest = publish(store, src, tmp_path / "layer.blob", "test/killed")
        lazy = lazy_factory(server.url, deadline=2.0, neighbor_bytes=0)
        lazy.add_layers([{"repo": "test/killed", "digest": digest}])
        top = lazy.layer_dir(digest)
        cached = (top / "d/f0.txt").read_bytes()
        with open(top / "big.bin", "rb") as f:
            assert f.read(1 << 20) == big[: 1 << 20]
            server.kill()  # mid-read: the rest of the file is not local
            t0 = time.monotonic()
            with pytest.raises(OSError) as exc:
                while f.read(1 << 20):
                    pass
            assert exc.value.errno == errno.EIO
            assert time.monotonic() - t0 < 2.0 + 15  # bounded by the deadline, not a hang
        assert read_errno(top / "d/f7.txt") == errno.EIO
        assert lazy.healthy()
        assert (top / "d/f0.txt").read_bytes() == cached  # cached data keeps serving
        events = [e["type"] for e in lazy.stats()["fetch"]["events"]]
        assert "registry_retry" in events

        server = RegistryServer(tmp_path / "reg", f"127.0.0.1:{port}").start()  # it comes back
        assert (top / "d/f7.txt").read_bytes() == (src / "d/f7.txt").read_bytes()
        assert (top / "big.bin").read_bytes() == big
    finally:
        server.stop()


def test_flipped_byte_in_registry_storage_is_never_served(tmp_path, registry, registry_store, lazy_factory, unique_repo):
    src = tmp_path / "src"
    src.mkdir()
    victim = os.urandom(300_000)
    (src / "victim.bin").write_bytes(victim)
    (src / "other.txt").write_bytes(b"other " * 1000)
    blob = tmp_path / "layer.blob"
    digest = publish(registry_store, src, blob, unique_repo)
    reader = LayerReader(FileBlobSource(blob))
    chunk = reader.entry("victim.bin").chunks[0]
    hexd = digest.split(":")[1]
    data_path = registry.root / "data/docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"
    raw = bytearray(data_path.read_bytes())
    raw[chunk.blob_offset + 1000] ^= 0xFF
    data_path.write_bytes(bytes(raw))

    lazy = lazy_factory(registry_store.url, neighbor_bytes=0)
    lazy.add_layers([{"repo": unique_repo, "digest": digest}])
    top = lazy.layer_dir(digest)
    assert read_errno(top / "victim.bin") == errno.EIO
    assert (top / "other.txt").read_bytes() == b"other " * 1000
    stats = lazy.stats()
    events = [e for e in stats["fetch"]["events"] if e["type"] == "integrity_error"]
    assert events and events[0]["chunk"] == chunk.digest
    assert lazy.chunk(chunk.digest) is None  # not cached anywhere
    assert not any(p.name == chunk.digest.split(":")[1] for p in (tmp_path / "node/state/chunks").rglob("*"))
