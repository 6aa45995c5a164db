"""The copy of a frozen upper (run/snapshot.py `copy_upper`, made by native rollstack-treecp):
everything `cp -a` keeps, kept the same (compared entry by entry with `cp -a`'s copy of the same
tree); a tree too deep for its descriptors falls back to `cp -a`; a full disk is DiskFull and
leaves no half layer; nothing in the source is ever followed."""

from __future__ import annotations

import hashlib
import os
import socket
import stat
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollstack.errors import DiskFull
from rollstack.run import snapshot
from rollstack.run.snapshot import TREECP_NAME, copy_upper

pytestmark = pytest.mark.integration
OPAQUE = "trusted.overlay.opaque"


@pytest.fixture(scope="module")
def treecp() -> str:
    found = snapshot._treecp()
    assert found is not None, f"{TREECP_NAME} is not built: `make setup` (native/build.sh) builds it"
    return found


def manifest(root: Path) -> dict[str, tuple]:
    """Every entry under `root` (relative path -> what a copy must keep), hard links as groups."""
    out: dict[str, tuple] = {}
    inodes: dict[int, str] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in ["", *dirs, *files] if dirpath == str(root) else [*dirs, *files]:
            path = os.path.join(dirpath, name) if name else dirpath
            rel = os.path.relpath(path, root)
            s = os.lstat(path)
            xattrs = tuple(sorted((k, os.getxattr(path, k, follow_symlinks=False))
                                  for k in os.listxattr(path, follow_symlinks=False)))
            if stat.S_ISREG(s.st_mode):
                with open(path, "rb") as f:
                    content = hashlib.sha256(f.read()).hexdigest()
                first = inodes.setdefault(s.st_ino, rel) if s.st_nlink > 1 else rel
                content = (content, first if first != rel else None, s.st_blocks * 512 < s.st_size)
            elif stat.S_ISLNK(s.st_mode):
                content = os.readlink(path)
            elif stat.S_ISCHR(s.st_mode) or stat.S_ISBLK(s.st_mode):
                content = s.st_rdev
            else:
                content = None
            out[rel] = (stat.S_IFMT(s.st_mode), stat.S_IMODE(s.st_mode), s.st_uid, s.st_gid, s.st_size,
                        s.st_mtime_ns, xattrs, content)
    return out


def _hostile_tree(src: Path) -> None:
    """Everything an overlay upper can hold, owned, moded and timed unlike the defaults."""
    (src / "d" / "e").mkdir(parents=True)
    (src / "d" / "e" / "f.txt").write_bytes(os.urandom(10_000))
    (src / "empty").write_bytes(b"")
    (src / "ro").write_text("read-only\n")
    os.chmod(src / "ro", 0o444)
    (src / "suid").write_bytes(b"#!/bin/sh\n")
    os.chown(src / "suid", 100000, 100001)
    os.chmod(src / "suid", 0o4755)
    with open(src / "sparse", "wb") as f:  # 8 MiB with 4 KiB of data in the middle
        f.seek(4 << 20)
        f.write(b"x" * 4096)
        f.truncate(8 << 20)
    os.link(src / "d" / "e" / "f.txt", src / "hardlink")
    os.symlink("/etc/passwd", src / "abs-link")
    os.symlink("../nowhere", src / "dangling")
    os.symlink("d", src / "dir-link")
    os.lchown(src / "dangling", 100002, 100003)
    os.mknod(src / "whiteout", 0o600 | stat.S_IFCHR, os.makedev(0, 0))
    os.mkfifo(src / "fifo")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(src / "sock"))
    (src / "opaque").mkdir()
    os.setxattr(src / "opaque", OPAQUE, b"y")
    (src / "opaque" / "inside").write_text("only me\n")
    os.setxattr(src / "d" / "e" / "f.txt", "user.note", b"kept")
    (src / "locked").mkdir(mode=0o000)
    os.chmod(src / "locked", 0o000)
    (src / "sticky").mkdir()
    os.chmod(src / "sticky", 0o1777)
    weird = os.fsencode(str(src)) + b"/new\nline \xff" + b"x" * 200
    with open(weird, "wb") as f:
        f.write(b"odd name\n")
    (src / ("n" * 255)).write_text("long name\n")
    for i, p in enumerate(sorted(src.rglob("*"), reverse=True)):
        os.utime(p, ns=(1_600_000_000_123_456_789 + i, 1_500_000_000_987_654_321 + i), follow_symlinks=False)
    os.utime(src, ns=(1_600_000_000_000_000_001, 1_500_000_000_000_000_001))


def test_keeps_what_cp_a_keeps(tmp_path, treecp):
    src = tmp_path / "src"
    src.mkdir()
    _hostile_tree(src)
    want = manifest(src)
    copy_upper(src, tmp_path / "ours")
    subprocess.run(["cp", "-a", "--no-target-directory", src, tmp_path / "cp"], check=True)
    got, cp = manifest(tmp_path / "ours"), manifest(tmp_path / "cp")
    assert got == want
    assert got == cp
    assert got["sparse"][-1][2], "the sparse file was filled"
    assert got["hardlink"][-1][1] == "d/e/f.txt" or got["d/e/f.txt"][-1][1] == "hardlink"
    assert not (tmp_path / "ours.tmp").exists()


def test_follows_nothing(tmp_path, treecp):
    """A symlink to a directory outside, and one replacing a path the copy goes through, stay links."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("not copied\n")
    src = tmp_path / "src"
    src.mkdir()
    os.symlink(outside, src / "escape")
    proc = subprocess.run([treecp, src, tmp_path / "dst"], capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert os.readlink(tmp_path / "dst" / "escape") == str(outside)
    assert sorted(os.listdir(tmp_path / "dst")) == ["escape"]
    link = subprocess.run([treecp, src / "escape", tmp_path / "dst2"], capture_output=True)
    assert link.returncode == 0, link.stderr  # the source itself is not followed either (as cp -a)
    assert os.readlink(tmp_path / "dst2") == str(outside)
    exists = subprocess.run([treecp, src, tmp_path / "dst"], capture_output=True)
    assert exists.returncode == 1 and b"File exists" in exists.stderr


def test_one_file(tmp_path, treecp):
    """A single entry as the source (merge_uppers copies files one by one)."""
    (tmp_path / "f").write_bytes(b"one\n")
    os.chown(tmp_path / "f", 1234, 5678)
    os.chmod(tmp_path / "f", 0o2751)
    os.setxattr(tmp_path / "f", "trusted.overlay.origin", b"\x00\x01")
    (tmp_path / "out").mkdir()
    copy_upper(tmp_path / "f", tmp_path / "out" / "g")
    assert manifest(tmp_path / "out")["g"] == manifest(tmp_path)["f"]


def test_too_deep_falls_back_to_cp(tmp_path, treecp, monkeypatch):
    """Deeper than the descriptors allow (64 here: depth 16): exit 3, and copy_upper uses cp -a."""
    src = tmp_path / "src"
    deep = src.joinpath(*["d"] * 40)
    deep.mkdir(parents=True)
    (deep / "leaf").write_text("bottom\n")
    limited = ["prlimit", "--nofile=64:64", treecp]
    proc = subprocess.run([*limited, src, tmp_path / "direct"], capture_output=True)
    assert proc.returncode == 3, proc.stderr
    assert b"deeper" in proc.stderr
    wrapper = tmp_path / "treecp-limited"
    wrapper.write_text(f'#!/bin/sh\nexec {" ".join(limited)} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setattr(snapshot, "_treecp", lambda: str(wrapper))
    copy_upper(src, tmp_path / "copy")
    assert manifest(tmp_path / "copy") == manifest(src)


def test_full_disk_is_disk_full_and_leaves_nothing(tmp_path, treecp):
    src = tmp_path / "src"
    src.mkdir()
    (src / "big").write_bytes(os.urandom(3 << 20))
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", small], check=True)
    try:
        with pytest.raises(DiskFull):
            copy_upper(src, small / "layer")
        assert os.listdir(small) == []
    finally:
        subprocess.run(["umount", small], check=True)


_names = st.text(st.characters(codec="utf-8", exclude_characters="/\x00"), min_size=1, max_size=12).filter(
    lambda n: n not in (".", ".."))
_tree = st.recursive(
    st.one_of(st.binary(max_size=3000), st.tuples(st.just("link"), _names), st.just("whiteout")),
    lambda children: st.dictionaries(_names, children, max_size=5), max_leaves=20)


def _build(path: Path, node, mode: int) -> None:
    if isinstance(node, dict):
        path.mkdir()
        for name, child in node.items():
            _build(path / name, child, mode)
        if mode % 3 == 0:
            os.setxattr(path, OPAQUE, b"y")
        os.chmod(path, 0o700 | mode % 0o100)
    elif isinstance(node, bytes):
        path.write_bytes(node)
        os.chown(path, mode, mode + 1)
        os.chmod(path, 0o600 | mode % 0o100)
    elif node == "whiteout":
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(0, 0))
    else:
        os.symlink(node[1], path)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=_tree.filter(lambda t: isinstance(t, dict)), mode=st.integers(0, 0o77))
def test_random_trees_equal_cp_a(tmp_path_factory, treecp, tree, mode):
    base = tmp_path_factory.mktemp("tree")
    _build(base / "src", tree, mode)
    copy_upper(base / "src", base / "ours")
    subprocess.run(["cp", "-a", "--no-target-directory", base / "src", base / "cp"], check=True)
    assert manifest(base / "ours") == manifest(base / "src") == manifest(base / "cp")
