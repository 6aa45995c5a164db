"""The shifted view (/shifted/<hex>) through real FUSE: same data, names, modes, xattrs and
links as /layers/<hex>, only the owners moved into the node's user-namespace range."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from lazystore_fixtures import build_tree, overlay, publish, walk

from rollstack.lazystore import shift

pytestmark = pytest.mark.integration


def test_shifted_view_is_the_layer_with_owners_moved(tmp_path, oci_store, lazy_factory):
    tree = build_tree(tmp_path / "src")
    os.chown(tree / "usr/bin/tool", 70000, 70001)  # outside the range: the overflow id
    digest = publish(oci_store, tree, tmp_path / "layer.blob", "test/shift")
    lazy = lazy_factory(oci_store.url)
    lazy.add_layers([{"repo": "test/shift", "digest": digest}])
    plain = lazy.layer_dir(digest)
    twin = Path(shift.shifted_path(plain))
    assert twin == tmp_path / "node/mnt/shifted" / digest.split(":")[1]
    assert sorted(os.listdir(tmp_path / "node/mnt")) == ["blobs", "layers", "shifted"]
    assert os.listdir(twin.parent) == os.listdir(plain.parent)
    checked = 0
    for src in walk(tree):
        rel = src.relative_to(tree)
        p, s = os.lstat(plain / rel), os.lstat(twin / rel)
        assert (s.st_mode, s.st_size, s.st_nlink, s.st_mtime_ns, s.st_rdev) == \
               (p.st_mode, p.st_size, p.st_nlink, p.st_mtime_ns, p.st_rdev), rel
        assert (s.st_uid, s.st_gid) == shift.shifted_ids(p.st_uid, p.st_gid), rel
        assert s.st_ino == p.st_ino | shift.SHIFT, rel
        assert os.listxattr(twin / rel, follow_symlinks=False) == \
               os.listxattr(plain / rel, follow_symlinks=False), rel
        if stat.S_ISREG(p.st_mode):
            assert (twin / rel).read_bytes() == (plain / rel).read_bytes() == src.read_bytes(), rel
            checked += 1
        elif stat.S_ISLNK(p.st_mode):
            assert os.readlink(twin / rel) == os.readlink(plain / rel)
        elif stat.S_ISDIR(p.st_mode):
            assert sorted(os.listdir(twin / rel)) == sorted(os.listdir(plain / rel)), rel
    assert checked > 40
    assert os.stat(twin / "etc/secret")[4:6] == (shift.BASE + 1234, shift.BASE + 5678)
    assert os.stat(twin / "usr/bin/tool")[4:6] == (shift.OVERFLOW, shift.OVERFLOW)
    assert os.stat(twin / "usr/bin/tool-hardlink").st_ino == os.stat(twin / "etc/tool-link2").st_ino
    assert os.getxattr(twin / "etc/hostname", "user.rollstack") == b"hello"
    assert os.stat(twin / "..").st_ino == os.stat(tmp_path / "node/mnt/shifted").st_ino
    assert os.stat(tmp_path / "node/mnt/shifted/..").st_ino == os.stat(tmp_path / "node/mnt").st_ino
    assert not (twin / "no-such-file").exists()
    with pytest.raises(OSError):
        (twin / "etc/new").write_text("x")  # read-only like /layers
    assert shift.shifted_path(tree) is None  # a local directory has no twin
    # overlayfs over the shifted view: copy-up keeps the shifted owner in the upper
    with overlay([twin], tmp_path / "ov") as merged:
        assert os.stat(merged / "etc/secret").st_uid == shift.BASE + 1234
        with open(merged / "etc/hostname", "a") as f:
            f.write("more\n")
        assert os.stat(tmp_path / "ov/upper/etc/hostname").st_uid == shift.BASE
        assert (merged / "etc/hostname").read_text() == "rollstack\nmore\n"
    assert (plain / "etc/hostname").read_text() == "rollstack\n"
