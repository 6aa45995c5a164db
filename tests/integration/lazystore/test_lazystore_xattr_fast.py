"""The xattr fast path (pyfuse3 patch level 3): overlayfs' `trusted.overlay.*` probes of inodes
without xattrs are answered ENODATA in C, without Python; inodes with xattrs (and opaque
directories) still get their values; a walk through an overlay makes almost no Python-level
getxattr requests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lazystore_fixtures import build_tree, overlay, publish

from rollstack.lazystore.fs import XATTR_FAST

pytestmark = pytest.mark.integration


def test_setup_installs_the_xattr_fast_path():
    import pyfuse3

    assert XATTR_FAST, "pyfuse3 is older than patch level 3: run `make setup` (third_party/pyfuse3/build.sh)"
    assert pyfuse3.ROLLSTACK_PATCH >= 3


def test_overlay_probes_are_answered_without_python(tmp_path, oci_store, lazy_factory):
    tree = build_tree(tmp_path / "src")
    lower = publish(oci_store, tree, tmp_path / "lower.blob", "test/lower")
    up = tmp_path / "upsrc"
    (up / "usr/lib/python3/json").mkdir(parents=True)
    (up / "usr/lib/python3/json/.wh..wh..opq").write_bytes(b"")
    (up / "usr/lib/python3/json/only.py").write_text("ONLY = 1\n")
    (up / "etc").mkdir()
    (up / "etc/.wh.secret").write_bytes(b"")
    upper = publish(oci_store, up, tmp_path / "upper.blob", "test/upper")
    lazy = lazy_factory(oci_store.url)
    lazy.add_layers([{"repo": "test/lower", "digest": lower}, {"repo": "test/upper", "digest": upper}])
    low, udir = lazy.layer_dir(lower), lazy.layer_dir(upper)
    ops0 = lazy.stats()["fuse_ops"]
    # values and absences are what the TOC says, on the fast path and off it
    assert os.getxattr(low / "etc/hostname", "user.rollstack") == b"hello"
    assert os.listxattr(low / "etc/hostname") == ["user.rollstack"]
    assert os.getxattr(udir / "usr/lib/python3/json", "trusted.overlay.opaque") == b"y"
    with pytest.raises(OSError):
        os.getxattr(low / "usr/bin/tool", "trusted.overlay.metacopy")
    assert os.listxattr(low / "usr/bin/tool") == []
    with overlay([udir, low], tmp_path / "ov") as root:
        assert os.listdir(root / "usr/lib/python3/json") == ["only.py"]  # the opaque marker holds
        assert not (root / "etc/secret").exists()
        n = 0
        for dirpath, dirs, files in os.walk(root):
            for f in files:
                p = Path(dirpath) / f
                if p.is_file() and not p.is_symlink():
                    p.read_bytes()
                    n += 1
        assert n > 40
    ops1 = lazy.stats()["fuse_ops"]
    fast = ops1["getxattr_fast"] - ops0.get("getxattr_fast", 0)
    slow = ops1.get("getxattr", 0) - ops0.get("getxattr", 0)
    assert fast > n  # every lower file probed for metacopy, directories for opaque/redirect/...
    assert slow <= 10, ops1  # only inodes that do have xattrs reach Python


def test_a_walkers_next_probe_is_waited_for_not_sent_through_the_event_loop(tmp_path, oci_store, lazy_factory):
    import pyfuse3

    assert pyfuse3.ROLLSTACK_PATCH >= 4, "pyfuse3 is older than patch level 4: run `make setup`"
    with pytest.raises(ValueError):
        pyfuse3.set_fast_linger(-1)
    tree = build_tree(tmp_path / "src")
    digest = publish(oci_store, tree, tmp_path / "lower.blob", "test/lower")
    files = [p for p in tree.rglob("*") if p.is_file() and not p.is_symlink()]
    results = {}
    for linger in (0, 5000):  # 5 ms: far longer than one probe's turnaround, even on a busy CI
        lazy = lazy_factory(oci_store.url, name=f"l{linger}", fuse_linger_us=linger)
        lazy.add_layers([{"repo": "test/lower", "digest": digest}])
        assert lazy.stats()["fuse_mode"]["fuse_linger_us"] == linger
        layer = lazy.layer_dir(digest)
        ours = [layer / p.relative_to(tree) for p in files]
        for p in ours:
            p.stat()  # looked up (and cached) before counting
        ops0 = lazy.stats()["fuse_ops"]
        for _ in range(10):
            for p in ours:
                with pytest.raises(OSError):
                    os.getxattr(p, "trusted.overlay.metacopy")
        ops1 = lazy.stats()["fuse_ops"]
        probes = ops1["getxattr_fast"] - ops0.get("getxattr_fast", 0)
        results[linger] = round((ops1["fast_drained"] - ops0.get("fast_drained", 0)) / probes, 3)
        assert probes >= 9 * len(ours)  # (a few test files do have xattrs: answered in Python)
    # Without the wait each probe wakes the event loop; with it nearly all ride the burst (every
    # 64th goes back through trio, plus whatever the scheduler delays by 5 ms).
    assert results[0] < 0.3, results
    assert results[5000] > 0.6, results
