"""The daemon's one config document, end to end: a real daemon process started from it, found by
it, and refused (before anything is mounted) when it cannot work."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rollstack.lazystore.config import daemon_pids
from rollstack.lazystore.recovery import mounted_at

pytestmark = pytest.mark.integration


def test_a_daemon_is_found_by_the_mountpoint_in_its_config(tmp_path, oci_store, lazy_factory):
    lazy = lazy_factory(oci_store.url)
    assert daemon_pids(lazy.mountpoint) == [lazy.process.pid]
    assert daemon_pids(tmp_path / "elsewhere") == []
    assert lazy.stats()["fuse_mode"]["no_open"] in (True, False)  # the FUSE layer reports through the service


def test_a_socket_path_over_the_unix_limit_exits_with_a_clear_error_and_no_mount(tmp_path, oci_store):
    mnt = tmp_path / "mnt"
    state = tmp_path / ("s" * 110)  # <state>/control.sock cannot be a unix socket path
    doc = {"mountpoint": str(mnt), "state_dir": str(state), "store": oci_store.url}
    proc = subprocess.run([sys.executable, "-m", "rollstack.lazystore.daemon", json.dumps(doc)],
                          capture_output=True, text=True, timeout=60, env=os.environ)
    assert proc.returncode == 2
    assert "unix socket path" in proc.stderr and "control.sock" in proc.stderr
    assert mounted_at(mnt) is None and not mnt.exists() and not state.exists()  # refused before anything


def test_an_unknown_field_is_refused(tmp_path, oci_store):
    doc = {"mountpoint": str(tmp_path / "mnt"), "state_dir": str(tmp_path / "st"), "store": oci_store.url,
           "fetch": {"neighbour_bytes": 0}}
    proc = subprocess.run([sys.executable, "-m", "rollstack.lazystore.daemon", "-"], input=json.dumps(doc),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "neighbour_bytes" in proc.stderr
    assert mounted_at(tmp_path / "mnt") is None
