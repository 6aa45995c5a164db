"""Pure diff parsing and applying: headers, quoting, binary payloads, exactness, corrupt input."""

from __future__ import annotations

import base64
import difflib
import zlib

import pytest
from hypothesis import given, strategies as st

from rollstack.errors import MutationFailed
from rollstack.plan.apply import apply_git_delta, apply_hunks, git_blob_id, new_content, split_lines
from rollstack.plan.patch import parse_patch


def test_git_headers_renames_modes_and_quoting():
    diff = (
        'diff --git "a/t\\303\\251st file" "b/t\\303\\251st file"\n'
        "old mode 100644\nnew mode 100755\n"
        "diff --git a/old name.py b/new name.py\nsimilarity index 100%\nrename from old name.py\nrename to new name.py\n"
        "diff --git a/empty b/empty\nnew file mode 100644\nindex 0000000..e69de29\n"
        "diff --git a/gone b/gone\ndeleted file mode 100755\nindex e69de29..0000000\n"
    )
    mode, rename, new, gone = parse_patch(diff)
    assert mode.old_path == mode.new_path == "tést file" and (mode.old_mode, mode.new_mode) == (0o100644, 0o100755)
    assert rename.rename and (rename.old_path, rename.new_path) == ("old name.py", "new name.py")
    assert new.is_new and new.path == "empty" and new.new_mode == 0o100644
    assert gone.is_delete and gone.old_path == "gone"


def test_plain_diff_with_timestamps_and_noise():
    diff = ("Subject: [PATCH] fix\n\nsome message\n---\n"
            "--- a/x.txt\t2024-01-01 00:00:00\n+++ b/x.txt\t2024-01-02 00:00:00\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n"
            "-- \n2.39.5\n")
    (p,) = parse_patch(diff)
    assert p.path == "x.txt" and len(p.hunks) == 1
    assert apply_hunks(b"a\nb\n", p.hunks, p.path) == b"a\nc\n"


def test_no_newline_markers():
    diff = "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n x\n-y\n\\ No newline at end of file\n+z\n"
    (p,) = parse_patch(diff)
    assert apply_hunks(b"x\ny", p.hunks, "f") == b"x\nz\n"
    with pytest.raises(MutationFailed):
        apply_hunks(b"x\ny\n", p.hunks, "f")  # the preimage had no final newline


def test_exactness_start_and_end_anchors():
    (p,) = parse_patch("--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n-a\n+A\n b\n")
    with pytest.raises(MutationFailed, match=r"f: hunk #1 \(@@ -1,2 \+1,2 @@\) does not apply"):
        apply_hunks(b"zzz\na\nb\n", p.hunks, "f")  # a hunk at line 1 must match at the start
    (p,) = parse_patch("--- a/f\n+++ b/f\n@@ -2,2 +2,2 @@\n b\n-c\n+C\n")
    with pytest.raises(MutationFailed):
        apply_hunks(b"a\nb\nc\nd\n", p.hunks, "f")  # no trailing context: must match at the end
    assert apply_hunks(b"a\nb\nc\n", p.hunks, "f") == b"a\nb\nC\n"


def test_offset_search_picks_the_nearest_match():
    (p,) = parse_patch("--- a/f\n+++ b/f\n@@ -5,3 +5,3 @@\n k\n-v\n+V\n k\n")
    old = b"k\nv\nk\nx\nx\nx\nk\nv\nk\n"
    assert apply_hunks(old, p.hunks, "f") == b"k\nv\nk\nx\nx\nx\nk\nV\nk\n"


@pytest.mark.parametrize("diff, match", [
    ("--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n-b\n", "truncated"),
    ("--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n*b\n+c\n", "corrupt patch"),
    ("--- a/f\n+++ b/f\n@@ -x +1 @@\n", "corrupt hunk header"),
    ("diff --git a/f b/f\nindex 1..2 100644\nGIT binary patch\nliteral 5\n!!!!!\n\n", "corrupt binary patch"),
])
def test_corrupt_patches(diff, match):
    with pytest.raises(MutationFailed, match=match):
        parse_patch(diff)


def _b85_lines(data: bytes) -> str:
    out = []
    for i in range(0, len(data), 52):
        chunk = data[i:i + 52]
        prefix = chr(ord("A") + len(chunk) - 1) if len(chunk) <= 26 else chr(ord("a") + len(chunk) - 27)
        padded = chunk + b"\0" * (-len(chunk) % 4)
        out.append(prefix + base64.b85encode(padded).decode())
    return "\n".join(out)


def test_binary_literal_and_delta():
    new = bytes(range(200)) * 2
    literal = zlib.compress(new)
    diff = f"diff --git a/b.bin b/b.bin\nnew file mode 100644\nindex 0000000..1111111\nGIT binary patch\nliteral {len(new)}\n{_b85_lines(literal)}\n\nliteral 0\nHcmV?d00001\n\n"
    (p,) = parse_patch(diff)
    assert new_content(b"", p) == new

    base = b"0123456789" * 10
    # copy base[0:50], insert b"XYZ", copy base[60:100]
    delta = bytes([100, 93, 0x90, 50, 3]) + b"XYZ" + bytes([0x91, 60, 40])
    assert apply_git_delta(base, delta) == base[:50] + b"XYZ" + base[60:]
    blob = zlib.compress(delta)
    oid = git_blob_id(base)
    diff = f"diff --git a/b.bin b/b.bin\nindex {oid[:7]}..2222222 100644\nGIT binary patch\ndelta {len(delta)}\n{_b85_lines(blob)}\n\n"
    (p,) = parse_patch(diff)
    assert new_content(base, p) == base[:50] + b"XYZ" + base[60:]
    with pytest.raises(MutationFailed, match="differs from its preimage"):
        new_content(base + b"!", p)


def test_binary_without_data_is_refused():
    (p,) = parse_patch("diff --git a/x b/x\nindex 1..2 100644\nBinary files a/x and b/x differ\n")
    with pytest.raises(MutationFailed, match="--binary"):
        new_content(b"old", p)


LINES = st.lists(st.sampled_from(["a\n", "b\n", "c\n", "\n", "def f():\n", "    pass\n"]), max_size=40)


@given(before=LINES, after=LINES, context=st.integers(0, 4))
def test_difflib_patches_reproduce_the_target(before, after, context):
    diff = "".join(difflib.unified_diff(before, after, "a/f", "b/f", n=context))
    patches = parse_patch(diff)
    if before == after:
        assert patches == []
        return
    (p,) = patches
    if context == 0:
        return  # unidiff-zero hunks need `git apply --unidiff-zero`; git refuses them by default too
    assert apply_hunks("".join(before).encode(), p.hunks, "f") == "".join(after).encode()


def test_split_lines():
    assert split_lines(b"") == [] and split_lines(b"a") == [b"a"] and split_lines(b"a\r\nb\n") == [b"a\r\n", b"b\n"]


DIFFISH = st.lists(st.sampled_from([
    "diff --git a/f b/f", 'diff --git "a/f', "diff --git a/x", "old mode 100644", "new mode 10x755", "new file mode 100644",
    "deleted file mode 100644", "rename from f", "rename to g", "index 123..456 100644", "index zz", "--- a/f", "+++ b/f",
    "--- /dev/null", "+++ /dev/null", "@@ -1,2 +1,2 @@", "@@ -1 +1 @@", "@@ -0,0 +1 @@", " a", "-b", "+c", "",
    "\\ No newline at end of file", "GIT binary patch", "literal 3", "delta 2", "zcmV?d00001", "Binary files differ",
]), max_size=25).map(lambda lines: "\n".join(lines) + "\n")


@given(DIFFISH, st.binary(max_size=30))
def test_garbage_only_ever_raises_mutation_failed(diff, old):
    try:
        for p in parse_patch(diff):
            new_content(old, p)
    except MutationFailed:
        pass
