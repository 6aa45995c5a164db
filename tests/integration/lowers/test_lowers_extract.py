"""Materialization by extraction (`rollstack.lowers.extract`): the blob streamed once into a
directory, no FUSE. The result equals the layer's FUSE view entry by entry, chunks the node's
disk cache holds are not fetched again, a corrupted blob fails without leaving a directory in
place, and the node's materializer uses it (its own low-priority process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollstack.errors import IntegrityError
from rollstack.lazystore.client import LazyStoreClient
from rollstack.lazystore.config import DaemonConfig
from rollstack.lowers.extract import extract_layer, spawn_args
from rollstack.lowers.materialize import LayerMaterializer
from test_lowers_materialize_fs import describe, lower_tree, publish, upper_tree

pytestmark = pytest.mark.integration


@pytest.fixture
def lazy(tmp_path: Path, oci_store):
    client = LazyStoreClient.start(DaemonConfig.of(tmp_path / "mnt", tmp_path / "state", oci_store.url))
    try:
        yield client
    finally:
        client.stop()


def reader(store, ref):
    return (lambda o, n: store.read_blob(ref.repo, ref.digest, o, n)), store.blob_size(ref.repo, ref.digest)


def test_extraction_equals_the_fuse_view(tmp_path, oci_store, lazy):
    low = publish(oci_store, lower_tree(tmp_path / "low"), tmp_path / "low.blob", "test/ex-low")
    up = publish(oci_store, upper_tree(tmp_path / "up"), tmp_path / "up.blob", "test/ex-up")
    lazy.add_layers([low, up])
    for ref in (low, up):
        read, size = reader(oci_store, ref)
        dst = tmp_path / "out" / ref.digest.partition(":")[2]
        dst.parent.mkdir(exist_ok=True)
        stats = extract_layer(read, size, dst)
        assert stats.fetched_bytes > 0 and stats.from_cache_bytes == 0
        assert describe(dst) == describe(lazy.layer_dir(ref.digest))
    up_copy = describe(tmp_path / "out" / up.digest.partition(":")[2])
    assert up_copy["hidden"][7] == (("trusted.overlay.opaque", b"y"),)
    low_copy = describe(tmp_path / "out" / low.digest.partition(":")[2])
    assert low_copy["data/big-link.bin"][9] == low_copy["data/big.bin"][9]  # one inode
    assert low_copy["bin/tool"][1] == 0o4755 and low_copy["data/empty"][2:4] == (1234, 4321)


def test_chunks_in_the_disk_cache_are_not_fetched_again(tmp_path, oci_store, lazy):
    low = publish(oci_store, lower_tree(tmp_path / "low"), tmp_path / "low.blob", "test/ex-low")
    lazy.add_layers([low])
    lazy.fetch_all([low])  # every chunk now in the daemon's disk cache
    lazy.stop()  # flushes the write-back queue
    read, size = reader(oci_store, low)
    stats = extract_layer(read, size, tmp_path / "copy", chunk_cache=tmp_path / "state" / "chunks")
    assert stats.from_cache_bytes >= 3 << 20 and stats.fetched_bytes < 64 << 10  # the TOC tail only
    assert (tmp_path / "copy" / "data" / "big.bin").read_bytes() == (tmp_path / "low" / "data" / "big.bin").read_bytes()


def test_a_corrupted_cached_chunk_is_refetched_and_a_corrupted_blob_fails(tmp_path, oci_store, lazy):
    low = publish(oci_store, lower_tree(tmp_path / "low"), tmp_path / "low.blob", "test/ex-low")
    lazy.add_layers([low])
    lazy.fetch_all([low])
    lazy.stop()
    cache = tmp_path / "state" / "chunks"
    for f in (cache / "sha256").rglob("*"):
        if f.is_file() and f.stat().st_size > 100_000:
            f.write_bytes(b"\0" * f.stat().st_size)  # a bad cache file is never used
    read, size = reader(oci_store, low)
    extract_layer(read, size, tmp_path / "copy", chunk_cache=cache)
    assert (tmp_path / "copy" / "data" / "big.bin").read_bytes() == (tmp_path / "low" / "data" / "big.bin").read_bytes()
    blob = bytearray((tmp_path / "low.blob").read_bytes())
    blob[200_000] ^= 0xFF  # inside big.bin's stored chunks
    with pytest.raises(IntegrityError):
        extract_layer(lambda o, n: bytes(blob[o:o + n]), len(blob), tmp_path / "bad")


def test_the_extract_process_and_the_materializer(tmp_path, oci_store, lazy):
    low = publish(oci_store, lower_tree(tmp_path / "low"), tmp_path / "low.blob", "test/ex-low")
    lazy.add_layers([low])
    dst = tmp_path / "proc-copy"
    out = subprocess.run(spawn_args(oci_store.url, low.repo, low.digest, dst, None), capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert '"files"' in out.stdout and describe(dst) == describe(lazy.layer_dir(low.digest))
    before = lazy.stats()["fetch"]["chunks_fetched"]
    m = LayerMaterializer(tmp_path / "layers", lazy, after=1, grace=0.0, min_free=0, store=oci_store.url,
                          chunk_cache=tmp_path / "state" / "chunks").start()
    try:
        m.used([low])
        assert m.wait_idle(60) and m.stats()["failures"] == 0
        assert lazy.stats()["fetch"]["chunks_fetched"] == before  # the daemon did no work for it
        assert describe(m.lower_for(low.digest)) == describe(lazy.layer_dir(low.digest))
        assert m.extract_stats and m.extract_stats[0]["files"] >= 4
    finally:
        m.stop()
    bad = LayerMaterializer(tmp_path / "layers2", lazy, after=1, grace=0.0, min_free=0, store=oci_store.url).start()
    try:
        bad.used([type(low)(low.repo, "sha256:" + "0" * 64)])  # not in the store: the copy fails, FUSE stays
        assert bad.wait_idle(60) and bad.stats()["failures"] == 1
        assert not list((tmp_path / "layers2").iterdir())
    finally:
        bad.stop()


def test_the_materializers_extraction_runs_in_its_capped_background_cgroup(tmp_path, oci_store, lazy):
    """The extraction joins the node's background cgroup before any work: the cgroup's CFS
    accounting sees it run under the quota, and the cgroup is gone after stop()."""
    low = publish(oci_store, lower_tree(tmp_path / "low"), tmp_path / "low.blob", "test/ex-low")
    lazy.add_layers([low])
    m = LayerMaterializer(tmp_path / "layers", lazy, after=1, grace=0.0, min_free=0, store=oci_store.url,
                          chunk_cache=tmp_path / "state" / "chunks", cpu=0.25,
                          cgroup_tag=f"t{os.getpid()}").start()
    try:
        assert m.cgroups, "no background cgroup was made (cpu controller missing?)"
        cpu_dirs = [cg for cg in m.cgroups if (cg / "cpu.cfs_quota_us").exists() or (cg / "cpu.max").exists()]
        for cg in cpu_dirs:
            quota = (cg / "cpu.cfs_quota_us").read_text().strip() if (cg / "cpu.cfs_quota_us").exists() \
                else (cg / "cpu.max").read_text().split()[0]
            assert quota == "25000"
        m.used([low])
        assert m.wait_idle(60) and m.stats()["failures"] == 0 and m.lower_for(low.digest) is not None
        stat = dict(line.split() for line in (cpu_dirs[0] / "cpu.stat").read_text().splitlines())
        assert int(stat.get("nr_periods", 0)) > 0  # a task of the cgroup ran under its quota
    finally:
        dirs = list(m.cgroups)
        m.stop()
    assert dirs and not any(cg.exists() for cg in dirs)
