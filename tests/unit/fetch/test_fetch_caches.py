"""Memory and disk chunk caches: budgets, LRU order, atomicity, restart, corruption."""

from __future__ import annotations

import hashlib
import os

import pytest

from rollstack.fetch import DiskChunkCache, MemoryChunkCache


def d(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def blobs(n: int, size: int) -> list[bytes]:
    return [bytes([i]) * size for i in range(n)]


def test_memory_cache_is_lru_within_budget():
    c = MemoryChunkCache(300)
    a, b, x, y = blobs(4, 100)
    for v in (a, b, x):
        c.put(d(v), v)
    assert c.get(d(a)) == a  # a is now most recent
    c.put(d(y), y)  # evicts b, the least recently used
    assert c.get(d(b)) is None
    assert c.get(d(a)) == a and c.get(d(x)) == x and c.get(d(y)) == y
    assert c.bytes == 300
    c.put(d(b"z" * 400), b"z" * 400)  # larger than the budget: not cached, nothing evicted
    assert c.bytes == 300 and len(c) == 3


def test_disk_cache_budget_lru_and_restart(tmp_path):
    c = DiskChunkCache(tmp_path, 1000)
    items = blobs(12, 100)
    for v in items[:10]:
        c.put(d(v), v)
    assert c.get(d(items[0])) == items[0]  # touch the oldest
    for v in items[10:]:
        c.put(d(v), v)
    assert c.bytes <= 1000 and c.disk_usage() == c.bytes
    assert d(items[0]) in c  # recently used: kept
    assert d(items[1]) not in c and d(items[2]) not in c  # least recently used: evicted
    assert c.evictions == 2

    again = DiskChunkCache(tmp_path, 1000)  # restart: the index is rebuilt from the directory
    assert len(again) == 10 and again.bytes == 1000
    assert again.get(d(items[11])) == items[11]
    smaller = DiskChunkCache(tmp_path, 500)  # a smaller budget evicts at startup
    assert smaller.bytes <= 500 and smaller.disk_usage() == smaller.bytes


def test_disk_cache_shares_identical_chunks(tmp_path):
    c = DiskChunkCache(tmp_path, 10_000)
    v = b"same bytes in two layers"
    c.put(d(v), v)
    c.put(d(v), v)
    assert len(c) == 1 and c.bytes == len(v)


def test_disk_cache_never_serves_a_torn_or_corrupt_file(tmp_path):
    c = DiskChunkCache(tmp_path, 10_000)
    good = b"a" * 100
    c.put(d(good), good)
    path = tmp_path / "sha256" / d(good)[7:9] / d(good)[7:]
    (tmp_path / "tmp" / "leftover.partial").write_bytes(b"torn")
    path.write_bytes(b"a" * 50)  # e.g. power loss after the rename
    restarted = DiskChunkCache(tmp_path, 10_000)
    assert not list((tmp_path / "tmp").iterdir())  # temp leftovers are removed
    assert restarted.get(d(good)) is None  # verified on first read after a restart
    assert d(good) not in restarted and not path.exists()
    assert restarted.rejected == 1


def test_disk_cache_rejects_bad_digests(tmp_path):
    c = DiskChunkCache(tmp_path, 100)
    for bad in ("md5:abc", "sha256:../../etc/passwd", "sha256:" + "G" * 64):
        with pytest.raises(ValueError):
            c.put(bad, b"x")
    assert not os.listdir(tmp_path / "tmp")
