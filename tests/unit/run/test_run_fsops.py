"""`TreeRoot`: entry facts, recursive listing, mkdir, move, remove inside a root, and never a
step outside it (absolute or climbing symlinks, `..`), never following a final symlink."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollstack.errors import InvalidRequest, NotFound, UnsafePath
from rollstack.run.fsops import AlreadyExists, TreeRoot


@pytest.fixture
def root(tmp_path: Path) -> TreeRoot:
    r = tmp_path / "root"
    (r / "a" / "b").mkdir(parents=True)
    (r / "a" / "f.txt").write_text("hello")
    (r / "a" / "b" / "g.txt").write_text("x")
    os.symlink("/etc", r / "abs")
    os.symlink("../..", r / "a" / "up")
    os.symlink("b", r / "a" / "rel")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep").write_text("keep")
    return TreeRoot(r)


def test_entry_reports_files_dirs_and_symlinks_without_following(root):
    f = root.entry("/a/f.txt")
    assert (f.kind, f.size, f.path, f.name) == ("file", 5, "/a/f.txt", "f.txt")
    assert root.entry("a").kind == "dir"
    link = root.entry("/abs")
    assert (link.kind, link.target) == ("symlink", "/etc")
    assert root.entry("/").path == "/"
    with pytest.raises(NotFound):
        root.entry("/a/nope")


def test_walk_depth_and_symlinked_dirs_not_entered(root):
    one = [e.path for e in root.walk("/a")]
    assert one == ["/a/b", "/a/f.txt", "/a/rel", "/a/up"]
    two = [e.path for e in root.walk("/a", depth=2)]
    assert "/a/b/g.txt" in two and not any(p.startswith("/a/rel/") for p in two)
    assert [e.path for e in root.walk("/a/rel")] == ["/a/rel/g.txt"]  # reached through a relative link
    with pytest.raises(InvalidRequest):
        root.walk("/a/f.txt")
    with pytest.raises(UnsafePath):
        root.walk("/abs")
    with pytest.raises(UnsafePath):
        root.walk("/a/up")


def test_make_dir_move_remove(root, tmp_path):
    assert root.make_dir("/n/m").kind == "dir"
    with pytest.raises(AlreadyExists):
        root.make_dir("/n/m")
    moved = root.move("/a/f.txt", "/n/m/deep/f2.txt")
    assert moved.path == "/n/m/deep/f2.txt" and (root.root / "n/m/deep/f2.txt").read_text() == "hello"
    with pytest.raises(InvalidRequest):
        root.move("/n", "/n/m/inside")
    root.move("/abs", "/moved-link")  # the link itself moves
    assert os.readlink(root.root / "moved-link") == "/etc"
    root.remove("/moved-link")
    assert Path("/etc").is_dir()
    root.remove("/a/up")  # a climbing link is removed, its target untouched
    assert (tmp_path / "outside" / "keep").exists()
    root.remove("/n")
    assert not (root.root / "n").exists()
    with pytest.raises(UnsafePath):
        root.remove("/")
    with pytest.raises(NotFound):
        root.remove("/n")


def test_operations_through_escaping_links_are_refused(root, tmp_path):
    for op in (lambda: root.make_dir("/abs/x"), lambda: root.make_dir("/a/up/outside/x"),
               lambda: root.remove("/a/up/outside/keep"), lambda: root.move("/a/f.txt", "/a/up/outside/f"),
               lambda: root.entry("/abs/passwd")):
        with pytest.raises(UnsafePath):
            op()
    assert sorted(os.listdir(tmp_path / "outside")) == ["keep"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "..", ".", "abs", "up", "rel", "f.txt", "x"]), min_size=1, max_size=6))
def test_no_path_escapes(tmp_path_factory, parts):
    base = tmp_path_factory.mktemp("fs")
    r = base / "root"
    (r / "a" / "b").mkdir(parents=True)
    os.symlink("/etc", r / "abs")
    os.symlink("../..", r / "a" / "up")
    os.symlink("b", r / "a" / "rel")
    (base / "outside").mkdir()
    tree = TreeRoot(r)
    path = "/" + "/".join(parts)
    for op in (lambda: tree.make_dir(path), lambda: tree.move("/a/b", path), lambda: tree.remove(path),
               lambda: tree.walk(path, 2), lambda: tree.entry(path)):
        try:
            op()
        except (InvalidRequest, NotFound, UnsafePath, NotADirectoryError):
            pass
    assert os.listdir(base / "outside") == []
    assert sorted(os.listdir(base)) == ["outside", "root"]


def test_set_attrs_changes_the_entry_itself_never_a_symlinks_target(root, tmp_path):
    outside = tmp_path / "outside" / "target"
    outside.write_text("x")
    outside.chmod(0o644)
    os.symlink(str(outside), root.root / "abs-link")
    (root.root / "f").write_text("data")
    e = root.set_attrs("/f", uid=1000, gid=1001, mode=0o600)
    assert (e.uid, e.gid, e.mode & 0o7777) == (1000, 1001, 0o600)
    st = os.stat(root.root / "f")
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (1000, 1001, 0o600)
    with pytest.raises(InvalidRequest, match="symlink"):
        root.set_attrs("/abs-link", mode=0o777)
    assert outside.stat().st_mode & 0o7777 == 0o644
    with pytest.raises(NotFound):
        root.set_attrs("/missing", mode=0o600)
    for bad in ({"mode": 0o17777}, {"uid": -1}, {"gid": 1 << 20}):
        with pytest.raises(InvalidRequest):
            root.set_attrs("/f", **bad)
    with pytest.raises(UnsafePath):
        root.set_attrs("/../f", mode=0o600)
