"""Daemon restart with the fd-holder: a running environment's overlay keeps working through it."""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from lazystore_fixtures import build_tree, overlay, publish

from rollstack.lazystore import holder
from rollstack.lazystore.recovery import mounted_at

pytestmark = pytest.mark.integration


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return build_tree(tmp_path / "src")


def _kill(lazy) -> None:
    """SIGKILL the daemon; return once its holder has seen it go."""
    os.kill(lazy.process.pid, signal.SIGKILL)
    lazy.process.wait()
    state = lazy.socket_path.parent
    deadline = time.monotonic() + 30
    while holder.ping(state) == "owned" and time.monotonic() < deadline:
        time.sleep(0.02)


def _wait_gone(state: Path, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while holder.ping(state) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    return holder.ping(state) is None


def test_killed_daemon_is_replaced_without_breaking_the_overlay(tmp_path, tree, oci_store, lazy_factory):
    digest = publish(oci_store, tree, tmp_path / "layer.blob", "test/handover")
    ref = {"repo": "test/handover", "digest": digest}
    lazy = lazy_factory(oci_store.url, holder_grace=60)
    assert lazy.stats()["fuse_mode"]["fd_holder"] is True
    lazy.add_layers([ref])
    mnt, state = tmp_path / "node/mnt", tmp_path / "node/state"
    dev = os.stat(mnt).st_dev
    with overlay([lazy.layer_dir(digest)], tmp_path / "ov") as root:  # a running environment
        assert (root / "etc/hostname").read_bytes() == (tree / "etc/hostname").read_bytes()
        _kill(lazy)
        assert holder.ping(state) == "orphaned"
        # a read that needs the daemon waits in the kernel's queue instead of failing
        got: dict[str, object] = {}

        def reader() -> None:
            try:
                got["bytes"] = (root / "usr/lib/python3/json/decoder.py").read_bytes()
            except OSError as exc:
                got["error"] = exc

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        time.sleep(0.5)
        assert t.is_alive() and not got  # queued, not failed

        lazy2 = lazy_factory(oci_store.url, holder_grace=60)  # same mountpoint and state dir
        t.join(30)
        assert got.get("bytes") == (tree / "usr/lib/python3/json/decoder.py").read_bytes(), got
        mode = lazy2.stats()["fuse_mode"]
        assert mode["takeover"] is True and mode["fd_holder"] is True
        assert os.stat(mnt).st_dev == dev  # the same connection, not a new mount
        # the old overlay reads, lists and stats uncached files through the new daemon
        for rel in ("usr/lib/python3/json/encoder.py", "big.bin", "deep/a/b/c/d/leaf.txt"):
            assert (root / rel).read_bytes() == (tree / rel).read_bytes(), rel
        assert sorted(os.listdir(root / "usr/bin")) == sorted(os.listdir(tree / "usr/bin"))
        # (right bytes through the old overlay = the same inode numbers: the kernel asked by inode)
        # the layer was restored from the TOC cache before the first request was served
        added = lazy2.add_layers([ref])
        assert added["layers"][0]["loaded"] is True and added["layers"][0]["toc_requests"] == 0

        # a second handover works the same way
        _kill(lazy2)
        lazy3 = lazy_factory(oci_store.url, holder_grace=60)
        assert lazy3.stats()["fuse_mode"]["takeover"] is True
        assert (root / "etc/tool-link2").read_bytes() == (tree / "etc/tool-link2").read_bytes()
    lazy3.stop()
    # stopping on purpose ends the connection: no mount, no holder
    assert mounted_at(mnt) is None
    assert _wait_gone(state)


def test_without_a_successor_the_holder_lets_go(tmp_path, tree, oci_store, lazy_factory):
    digest = publish(oci_store, tree, tmp_path / "layer.blob", "test/handover-none")
    lazy = lazy_factory(oci_store.url, holder_grace=1.5)
    lazy.add_layers([{"repo": "test/handover-none", "digest": digest}])
    top = lazy.layer_dir(digest)
    _kill(lazy)
    state = tmp_path / "node/state"
    assert _wait_gone(state, timeout=10)  # grace over: the holder closed the connection
    with pytest.raises(OSError) as exc:
        (top / "usr/lib/python3/json/encoder.py").read_bytes()
    assert exc.value.errno == errno.ENOTCONN  # never a hang
    # the next daemon clears the stale mount and mounts afresh
    lazy2 = lazy_factory(oci_store.url, holder_grace=1.5)
    assert lazy2.stats()["fuse_mode"]["takeover"] is False
    lazy2.add_layers([{"repo": "test/handover-none", "digest": digest}])
    assert (lazy2.layer_dir(digest) / "etc/hostname").read_bytes() == (tree / "etc/hostname").read_bytes()
