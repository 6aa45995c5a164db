"""LayerStack: composition rules, listdir/walk, and kernel-like symlink resolution (pure)."""

from __future__ import annotations

import errno

import pytest

from rollstack.errors import FormatError
from rollstack.format.toc import EntryType, Toc, TocEntry
from rollstack.plan.stack import LayerStack


def d(path, mode=0o755, opaque=False):
    return TocEntry(path, EntryType.DIR, mode=mode, opaque=opaque)


def f(path, size=1, mode=0o644):
    return TocEntry(path, EntryType.REG, mode=mode, size=size)


def ln(path, target):
    return TocEntry(path, EntryType.SYMLINK, mode=0o777, link=target)


def wh(path):
    return TocEntry(path, EntryType.WHITEOUT)


def test_higher_layer_overrides_and_dirs_merge():
    s = LayerStack([[d("etc"), f("etc/a", 1), f("etc/b", 2)], [d("etc", 0o700), f("etc/a", 10)]])
    assert s.listdir("/etc") == ["a", "b"]
    assert s.lookup("etc/a") == (1, f("etc/a", 10))
    assert s.lookup("/etc/b/")[0] == 0
    assert s.lookup("etc")[1].mode == 0o700


def test_whiteout_and_opaque_and_nondir_over_dir():
    s = LayerStack([
        [d("x"), f("x/1"), d("y"), f("y/1"), d("z"), d("z/deep"), f("z/deep/f")],
        [wh("x"), d("y", opaque=True), f("y/2"), f("z")],
    ])
    assert s.lookup("x") is None and s.lookup("x/1") is None
    assert s.listdir("y") == ["2"]
    assert s.lookup("z")[1].type == EntryType.REG and s.lookup("z/deep/f") is None
    assert [p for p, _, _ in s.walk()] == ["", "y", "y/2", "z"]


def test_whiteout_then_readded_above():
    s = LayerStack([[f("a")], [wh("a")], [d("a"), f("a/b")]])
    assert s.listdir("a") == ["b"]


def test_implicit_parent_directories():
    s = LayerStack([[f("a")], [f("a/b/c")]])
    assert s.lookup("a")[1].type == EntryType.DIR
    assert s.listdir("a/b") == ["c"]


def test_hardlink_resolves_in_its_own_layer():
    s = LayerStack([[f("t", 5)], [f("t", 7), TocEntry("h", EntryType.HARDLINK, link="t")], [wh("t")]])
    layer, entry = s.lookup("h")
    assert (layer, entry.path, entry.size) == (1, "t", 7)
    assert s.entry_at("h").path == "h"
    with pytest.raises(FormatError):
        LayerStack([[TocEntry("h", EntryType.HARDLINK, link="nope")]])


def test_accepts_toc_objects():
    s = LayerStack([Toc([d(""), f("a")]), Toc([f("b")])])
    assert s.listdir("") == ["a", "b"] and len(s) == 3


def test_listdir_errors():
    s = LayerStack([[f("a")]])
    with pytest.raises(FileNotFoundError):
        s.listdir("nope")
    with pytest.raises(NotADirectoryError):
        s.listdir("a")


def test_resolve_like_the_kernel():
    s = LayerStack([[
        d("usr"), d("usr/lib"), f("usr/lib/libc.so"), ln("lib", "usr/lib"), ln("abs", "/usr/lib/libc.so"),
        ln("up", "../../../usr"), ln("loop1", "loop2"), ln("loop2", "loop1"), ln("dangling", "missing/x"),
        d("d"), ln("d/rel", "../lib/libc.so"),
    ]])
    assert s.resolve("/lib/libc.so") == "usr/lib/libc.so"
    assert s.resolve("abs") == "usr/lib/libc.so"
    assert s.resolve("abs", follow=False) == "abs"
    assert s.resolve("up/lib") == "usr/lib"  # ".." stops at the root
    assert s.resolve("d/rel") == "usr/lib/libc.so"
    assert s.resolve("lib/new-file") == "usr/lib/new-file"
    with pytest.raises(OSError) as e:
        s.resolve("loop1")
    assert e.value.errno == errno.ELOOP
    with pytest.raises(FileNotFoundError):
        s.resolve("dangling")
    with pytest.raises(NotADirectoryError):
        s.resolve("usr/lib/libc.so/x")
