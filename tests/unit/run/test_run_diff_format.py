"""The diff text format (git-compatible headers, hunks, quoting) and LowerView's overlay rules."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rollstack.errors import InvalidRequest
from rollstack.run.diff import DEFAULT_EXCLUDES, format_file_diff, is_excluded, upper_diff
from rollstack.run.lowerview import OPAQUE_XATTR, Entry, LowerView


def entry(tmp_path: Path, name: str, data: bytes, mode: int = 0o644) -> Entry:
    p = tmp_path / name
    p.write_bytes(data)
    return Entry("file", mode, p)


def test_modified_file(tmp_path):
    old = entry(tmp_path, "o", b"1\n2\n3\n4\n5\n6\n7\n8\n9\n")
    new = entry(tmp_path, "n", b"1\n2\n3\n4\nFIVE\n6\n7\n8\n9\n")
    assert format_file_diff("src/x.py", old, new) == (
        "diff --git a/src/x.py b/src/x.py\n--- a/src/x.py\n+++ b/src/x.py\n"
        "@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+FIVE\n 6\n 7\n 8\n")


def test_new_deleted_empty_and_mode(tmp_path):
    e = entry(tmp_path, "e", b"hello")
    assert format_file_diff("a", None, e) == (
        "diff --git a/a b/a\nnew file mode 100644\n--- /dev/null\n+++ b/a\n"
        "@@ -0,0 +1 @@\n+hello\n\\ No newline at end of file\n")
    assert format_file_diff("a", e, None) == (
        "diff --git a/a b/a\ndeleted file mode 100644\n--- a/a\n+++ /dev/null\n"
        "@@ -1 +0,0 @@\n-hello\n\\ No newline at end of file\n")
    empty = entry(tmp_path, "empty", b"")
    assert format_file_diff("z", None, empty) == "diff --git a/z b/z\nnew file mode 100644\n"
    x = Entry("file", 0o755, e.host_path)
    assert format_file_diff("a", e, x) == "diff --git a/a b/a\nold mode 100644\nnew mode 100755\n"
    assert format_file_diff("a", e, Entry("file", 0o600, e.host_path)) == ""  # same git mode


def test_symlink_and_type_change(tmp_path):
    os.symlink("target/path", tmp_path / "l")
    link = Entry("symlink", 0o777, tmp_path / "l")
    out = format_file_diff("l", None, link)
    assert out.startswith("diff --git a/l b/l\nnew file mode 120000\n")
    assert "+target/path\n\\ No newline at end of file\n" in out
    f = entry(tmp_path, "f", b"x\n")
    both = format_file_diff("l", f, link)
    assert both.count("diff --git") == 2 and "deleted file mode 100644" in both


def test_binary_named(tmp_path):
    old = entry(tmp_path, "o", b"\x00\x01")
    new = entry(tmp_path, "n", b"\x00\x02")
    assert format_file_diff("b.bin", old, new) == (
        "diff --git a/b.bin b/b.bin\nBinary files a/b.bin and b/b.bin differ\n")
    latin = entry(tmp_path, "l", b"caf\xe9\n")
    assert "Binary files /dev/null and b/c differ" in format_file_diff("c", None, latin)


def test_quoting_and_spaces(tmp_path):
    e = entry(tmp_path, "e", b"x\n")
    out = format_file_diff('we"ird\tname', None, e)
    assert out.startswith('diff --git "a/we\\"ird\\tname" "b/we\\"ird\\tname"\n')
    out = format_file_diff("with space.txt", None, e)
    assert "+++ b/with space.txt\t\n" in out
    assert format_file_diff("ü", None, e).startswith('diff --git "a/\\303\\274" "b/\\303\\274"')


def test_only_newline_splits_lines(tmp_path):
    old = entry(tmp_path, "o", b"a\rb\x0cc\n")
    new = entry(tmp_path, "n", b"a\rb\x0cd\n")
    out = format_file_diff("f", old, new)
    assert "-a\rb\x0cc\n+a\rb\x0cd\n" in out


def test_excludes():
    assert is_excluded("/tmp/x", DEFAULT_EXCLUDES)
    assert is_excluded("/tmp", DEFAULT_EXCLUDES)
    assert not is_excluded("/tmpfoo/x", DEFAULT_EXCLUDES)
    assert is_excluded("/work/pkg/__pycache__/m.pyc", DEFAULT_EXCLUDES)
    assert is_excluded("/work/m.pyc", DEFAULT_EXCLUDES)
    assert is_excluded("/work/.git/index", DEFAULT_EXCLUDES)
    assert not is_excluded("/work/m.py", DEFAULT_EXCLUDES)
    assert not is_excluded("/tmp/x", ())


def test_bad_base(tmp_path):
    with pytest.raises(InvalidRequest):
        upper_diff(tmp_path, LowerView([tmp_path]), base="work")
    with pytest.raises(InvalidRequest):
        upper_diff(tmp_path, LowerView([tmp_path]), base="/work/../etc")


needs_root = pytest.mark.usefixtures("as_root")  # whiteouts (mknod) and trusted.* xattrs


@needs_root
def test_lowerview_whiteouts_opaque_and_shadowing(tmp_path):
    top, mid, bottom = (tmp_path / n for n in ("top", "mid", "bottom"))
    for d in (bottom / "d" / "sub", mid / "d", top / "d", top / "o", bottom / "o", bottom / "f"):
        d.mkdir(parents=True, exist_ok=True)
    (bottom / "d" / "sub" / "deep").write_text("deep")
    (bottom / "d" / "keep").write_text("bottom keep")
    (bottom / "d" / "gone").write_text("gone")
    (mid / "d" / "keep").write_text("mid keep")
    os.mknod(top / "d" / "gone", stat.S_IFCHR, os.makedev(0, 0))
    (bottom / "o" / "hidden").write_text("hidden")
    (top / "o" / "shown").write_text("shown")
    os.setxattr(top / "o", OPAQUE_XATTR, b"y")
    (bottom / "f" / "under-file").write_text("x")
    (mid / "f").write_text("f is a file now")
    view = LowerView([top, mid, bottom])
    assert view.entry("d/keep").read() == b"mid keep"
    assert view.entry("d/gone") is None
    assert view.entry("d/sub/deep").read() == b"deep"
    assert view.listdir("d") == ["keep", "sub"]
    assert view.entry("o/hidden") is None and view.listdir("o") == ["shown"]
    assert view.entry("f").kind == "file" and view.entry("f/under-file") is None
    assert view.listdir("f") == []
    assert sorted(view.walk_files()) == ["d/keep", "d/sub/deep", "f", "o/shown"]


@needs_root
def test_upper_diff_whiteout_and_opaque_semantics(tmp_path):
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    (lower / "dir").mkdir(parents=True)
    (lower / "dir" / "a").write_text("a\n")
    (lower / "dir" / "b").write_text("b\n")
    (lower / "file").write_text("f\n")
    (upper / "dir").mkdir(parents=True)
    os.setxattr(upper / "dir", OPAQUE_XATTR, b"y")  # rm -rf dir; mkdir dir; echo > dir/a
    (upper / "dir" / "a").write_text("a\n")          # same content as before: no diff
    os.mknod(upper / "file", stat.S_IFCHR, os.makedev(0, 0))
    out = upper_diff(upper, LowerView([lower]))
    assert out == ("diff --git a/dir/b b/dir/b\ndeleted file mode 100644\n--- a/dir/b\n"
                   "+++ /dev/null\n@@ -1 +0,0 @@\n-b\n"
                   "diff --git a/file b/file\ndeleted file mode 100644\n--- a/file\n"
                   "+++ /dev/null\n@@ -1 +0,0 @@\n-f\n")


def test_binary_patch_mode(tmp_path):
    old = entry(tmp_path, "o", b"\x00old")
    new = entry(tmp_path, "n", b"\x00new" * 40)
    out = format_file_diff("b.bin", old, new, binary="patch")
    lines = out.splitlines()
    assert lines[0] == "diff --git a/b.bin b/b.bin"
    # full blob ids, as `git hash-object` computes them
    import hashlib
    oid = hashlib.sha1(b"blob 4\x00\x00old").hexdigest()
    assert lines[1].startswith(f"index {oid}..") and lines[1].endswith(" 100644")
    assert lines[2] == "GIT binary patch" and lines[3] == "literal 160"
    with pytest.raises(InvalidRequest):
        format_file_diff("b.bin", old, new, binary="base64")
