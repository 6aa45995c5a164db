"""SafeRoot: every path stays inside the root, whatever a command planted there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from rollstack.errors import InvalidRequest, NotFound, UnsafePath
from rollstack.run.files import SafeRoot, split_request


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    (r / "etc").mkdir(parents=True)
    (r / "etc" / "passwd").write_text("env-passwd\n")
    (r / "work" / "pkg").mkdir(parents=True)
    (r / "work" / "pkg" / "a.py").write_text("print('a')\n")
    return r


def test_read_write_list_stat(root: Path):
    fs = SafeRoot(root)
    assert fs.read_file("/etc/passwd") == b"env-passwd\n"
    assert fs.read_file("etc//./passwd") == b"env-passwd\n"
    fs.write_file("/new/deep/dir/file.txt", b"data", mode=0o600)
    assert (root / "new/deep/dir/file.txt").read_bytes() == b"data"
    assert (root / "new/deep/dir/file.txt").stat().st_mode & 0o777 == 0o600
    fs.write_file("/work/pkg/a.py", b"replaced")
    assert fs.read_file("/work/pkg/a.py") == b"replaced"
    names = [(e.name, e.type) for e in fs.list_dir("/work")]
    assert names == [("pkg", "dir")]
    info = fs.stat("/work/pkg/a.py")
    assert (info.type, info.size) == ("file", 8)
    assert fs.stat("/").type == "dir"
    assert fs.exists("/etc/passwd") and not fs.exists("/nope")
    with pytest.raises(NotFound):
        fs.read_file("/nope/x")
    with pytest.raises(InvalidRequest):
        fs.read_file("/work")
    with pytest.raises(InvalidRequest):
        fs.write_file("/", b"x")
    with pytest.raises(InvalidRequest):
        fs.list_dir("/etc/passwd")


@pytest.mark.parametrize("path", ["..", "../etc/passwd", "/work/../../etc/passwd", "a/../b",
                                  "/work/pkg/..", "x\x00y"])
def test_dotdot_and_nul_refused(root: Path, path: str):
    with pytest.raises(UnsafePath):
        SafeRoot(root).read_file(path)
    with pytest.raises(UnsafePath):
        SafeRoot(root).write_file(path, b"x")


def test_absolute_symlinks_refused_everywhere(root: Path, tmp_path: Path):
    host = tmp_path / "host-secret"
    host.write_text("host")
    os.symlink("/etc/passwd", root / "work" / "pw")
    os.symlink(str(tmp_path), root / "work" / "hostdir")
    fs = SafeRoot(root)
    for p in ("/work/pw", "/work/hostdir/host-secret"):
        with pytest.raises(UnsafePath):
            fs.read_file(p)
        with pytest.raises(UnsafePath):
            fs.write_file(p, b"pwned")
    assert host.read_text() == "host"
    assert Path("/etc/passwd").read_text() != "pwned"
    # listing shows the link without following it
    assert {e.name: e.target for e in fs.list_dir("/work")}["pw"] == "/etc/passwd"


def test_relative_symlinks_followed_inside_but_not_above_root(root: Path, tmp_path: Path):
    (tmp_path / "outside.txt").write_text("outside")
    os.symlink("../../etc/passwd", root / "work" / "pkg" / "rel")
    os.symlink("pkg", root / "work" / "alias")
    os.symlink("../../outside.txt", root / "work" / "escape")
    os.symlink("../..", root / "work" / "up2")
    fs = SafeRoot(root)
    assert fs.read_file("/work/pkg/rel") == b"env-passwd\n"
    assert fs.read_file("/work/alias/a.py") == b"print('a')\n"
    fs.write_file("/work/alias/b.py", b"b")
    assert (root / "work/pkg/b.py").read_bytes() == b"b"
    for p in ("/work/escape", "/work/up2/outside.txt"):
        with pytest.raises(UnsafePath):
            fs.read_file(p)
        with pytest.raises(UnsafePath):
            fs.write_file(p, b"x")
    assert (tmp_path / "outside.txt").read_text() == "outside"


def test_symlink_loops_end(root: Path):
    os.symlink("b", root / "a")
    os.symlink("a", root / "b")
    with pytest.raises(UnsafePath):
        SafeRoot(root).read_file("/a")


def test_non_regular_files_refused(root: Path):
    os.mkfifo(root / "fifo")
    with pytest.raises(InvalidRequest):
        SafeRoot(root).read_file("/fifo")


names = st.text(alphabet=st.characters(blacklist_characters="/\x00", codec="utf-8"),
                min_size=1, max_size=12).filter(lambda s: s not in (".", ".."))


@settings(max_examples=60, deadline=None)
@given(parts=st.lists(st.one_of(names, st.sampled_from(["..", ".", ""])), max_size=6),
       data=st.binary(max_size=64))
def test_any_request_path_stays_inside(tmp_path_factory, parts: list[str], data: bytes):
    base = tmp_path_factory.mktemp("prop")
    root = base / "root"
    root.mkdir()
    path = "/".join(parts)
    fs = SafeRoot(root)
    try:
        fs.write_file(path, data)
    except (UnsafePath, InvalidRequest, NotFound, OSError) as e:
        if ".." in [p for p in parts]:
            assert isinstance(e, UnsafePath)
        return
    assert ".." not in parts
    # whatever was written is inside root, and nothing appeared beside it
    assert sorted(p.name for p in base.iterdir()) == ["root"]
    assert fs.read_file(path) == data
    clean = [p for p in split_request(path)]
    assert (root.joinpath(*clean)).read_bytes() == data


link_targets = st.lists(st.sampled_from(["..", ".", "a", "b", "f", "outside", "x"]),
                        min_size=1, max_size=5).map("/".join)


@settings(max_examples=80, deadline=None)
@given(links=st.lists(st.tuples(st.sampled_from(["a/l1", "b/l2", "l3", "a/b2/l4"]),
                                st.one_of(link_targets, link_targets.map(lambda t: "/" + t))),
                      max_size=4),
       requests=st.lists(st.lists(st.sampled_from(["a", "b", "b2", "l1", "l2", "l3", "l4",
                                                   "f", "outside", "new"]),
                                  min_size=1, max_size=5).map("/".join), min_size=1, max_size=6))
def test_planted_symlinks_never_reach_outside(tmp_path_factory, links, requests):
    base = tmp_path_factory.mktemp("links")
    root, outside = base / "root", base / "outside"
    for d in (root / "a" / "b2", root / "b", outside):
        d.mkdir(parents=True, exist_ok=True)
    for f in (root / "f", root / "a" / "f", root / "a" / "b2" / "f", root / "b" / "f"):
        f.write_bytes(b"inside")
    (outside / "f").write_bytes(b"OUTSIDE")
    os.symlink("../outside", root / "outside")  # a planted escape hatch at the top
    for where, target in links:
        try:
            os.symlink(target, root / where)
        except FileExistsError:
            pass
    fs = SafeRoot(root)
    for req in requests:
        try:
            assert fs.read_file(req) in (b"inside", b"written")
        except (UnsafePath, NotFound, InvalidRequest):
            pass
        try:
            fs.write_file(req, b"written")
        except (UnsafePath, NotFound, InvalidRequest, IsADirectoryError, FileExistsError):
            pass
    assert sorted(p.name for p in outside.iterdir()) == ["f"]
    assert (outside / "f").read_bytes() == b"OUTSIDE"
    assert sorted(p.name for p in base.iterdir()) == ["outside", "root"]


@pytest.mark.usefixtures("as_root")  # mknod of a device
def test_device_nodes_are_never_opened(root: Path):
    import stat as st_
    # /dev/full: opening works, writing fails with ENOSPC; a plain open(O_WRONLY) would reach
    # the driver. SafeRoot must refuse before opening.
    os.mknod(root / "work" / "dev", st_.S_IFCHR | 0o666, os.makedev(1, 7))
    with pytest.raises(InvalidRequest, match="regular"):
        SafeRoot(root).write_file("/work/dev", b"x")
    with pytest.raises(InvalidRequest, match="regular"):
        SafeRoot(root).read_file("/work/dev")
