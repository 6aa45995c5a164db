"""The daemon's FUSE thread runs at SCHED_RR (reset on fork), its worker threads at normal
priority; `--fuse-priority normal` leaves every thread alone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lazystore_fixtures import build_tree, publish

pytestmark = pytest.mark.integration

SCHED_OTHER, SCHED_RR = 0, 2


def thread_policies(pid: int) -> dict[int, tuple[int, int]]:
    """tid -> (policy, nice) from /proc/<pid>/task/<tid>/stat."""
    out = {}
    for t in Path(f"/proc/{pid}/task").iterdir():
        f = (t / "stat").read_text().rsplit(")", 1)[1].split()
        out[int(t.name)] = (int(f[38]), int(f[16]))  # fields 41 (policy) and 19 (nice), 1-based
    return out


def test_the_fuse_thread_is_realtime_and_its_workers_are_not(tmp_path, oci_store, lazy_factory):
    digest = publish(oci_store, build_tree(tmp_path / "src"), tmp_path / "layer.blob", "test/prio")
    lazy = lazy_factory(oci_store.url)
    lazy.add_layers([{"repo": "test/prio", "digest": digest}])  # trio starts worker threads for the TOC
    (lazy.layer_dir(digest) / "big.bin").read_bytes()
    assert lazy.stats()["fuse_mode"]["fuse_priority"] == "rr"
    pols = thread_policies(lazy.process.pid)
    assert os.getpid() not in pols
    main = pols[lazy.process.pid]
    assert main == (SCHED_RR, 0)
    workers = [p for tid, p in pols.items() if tid != lazy.process.pid]
    assert workers and all(p == (SCHED_OTHER, 0) for p in workers), pols


def test_normal_priority_changes_nothing(tmp_path, oci_store, lazy_factory):
    lazy = lazy_factory(oci_store.url, fuse_priority="normal")
    assert lazy.stats()["fuse_mode"]["fuse_priority"] == "normal"
    assert all(p[0] == SCHED_OTHER for p in thread_policies(lazy.process.pid).values())
