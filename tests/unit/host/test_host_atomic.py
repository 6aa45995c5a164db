"""host.atomic: tmp + rename replacement, through a tmp inode reserved ahead of time."""

from __future__ import annotations

import os
import threading

import pytest

from rollstack.host import atomic


def test_replace_writes_through_the_reserved_tmp_without_a_new_inode(tmp_path):
    target = tmp_path / "meta.json"
    target.write_bytes(b"old")
    atomic.reserve(target)
    tmp = atomic.tmp_of(target)
    ino = os.stat(tmp).st_ino
    atomic.replace(target, b'{"new": 1}')
    assert target.read_bytes() == b'{"new": 1}'
    assert os.stat(target).st_ino == ino  # the reserved inode became the file
    assert not tmp.exists()


def test_replace_without_a_reservation_creates_the_tmp(tmp_path):
    target = tmp_path / "r.json"
    atomic.replace(target, b"x" * 100_000)
    atomic.replace(target, b"short")  # truncated, not overwritten in place
    assert target.read_bytes() == b"short"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_a_reused_tmp_is_truncated(tmp_path):
    target = tmp_path / "t.json"
    atomic.tmp_of(target).write_bytes(b"a stale, longer leftover of a crashed writer")
    atomic.replace(target, b"ok")
    assert target.read_bytes() == b"ok"


def test_a_symlink_planted_as_the_tmp_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    target = tmp_path / "d" / "meta.json"
    target.parent.mkdir()
    os.symlink(outside, atomic.tmp_of(target))
    with pytest.raises(OSError):
        atomic.replace(target, b"evil")
    assert outside.read_bytes() == b"keep" and not target.exists()


def test_discard_removes_an_unused_reservation(tmp_path):
    target = tmp_path / "x.json"
    atomic.reserve(target)
    atomic.discard(target)
    atomic.discard(target)  # twice is fine
    assert list(tmp_path.iterdir()) == []


def test_readers_never_see_a_torn_file(tmp_path):
    target = tmp_path / "s.json"
    a, b = b"A" * 300_000, b"B" * 200_000
    atomic.replace(target, a)
    stop, seen = threading.Event(), set()

    def read() -> None:
        while not stop.is_set():
            seen.add(target.read_bytes())

    t = threading.Thread(target=read)
    t.start()
    try:
        for i in range(200):
            atomic.replace(target, a if i % 2 else b)
    finally:
        stop.set()
        t.join()
    assert seen <= {a, b}
