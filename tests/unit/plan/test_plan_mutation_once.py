"""A mutation planned once and written into N identical trees (a GRPO group, node/fanout.py)
gives exactly the trees N separate `apply_mutation`s give; a root whose symlinks would lead the
write outside it is refused there, whatever the tree the plan was computed from."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollstack.errors import MutationFailed, UnsafePath
from rollstack.plan.mutation import apply_mutation, plan_mutation, write_mutation

NAMES = st.sampled_from(["a.txt", "b.py", "pkg/c.py", "pkg/sub/d.txt", "e"])
LINES = st.lists(st.text(alphabet="xyz ", min_size=0, max_size=6), min_size=1, max_size=6)


def _text(lines: list[str]) -> str:
    return "".join(f"{line}\n" for line in lines)


def _diff_new(path: str, after: str, mode: str = "100644") -> str:
    body = "".join(f"+{line}" for line in after.splitlines(keepends=True))
    n = len(after.splitlines())
    return (f"diff --git a/{path} b/{path}\nnew file mode {mode}\n--- /dev/null\n+++ b/{path}\n"
            f"@@ -0,0 +1,{n} @@\n{body}")


def _diff_delete(path: str, before: str) -> str:
    body = "".join(f"-{line}" for line in before.splitlines(keepends=True))
    n = len(before.splitlines())
    return (f"diff --git a/{path} b/{path}\ndeleted file mode 100644\n--- a/{path}\n+++ /dev/null\n"
            f"@@ -1,{n} +0,0 @@\n{body}")


@st.composite
def cases(draw):
    """(files of the tree, the diff): modify, delete and create files under the workdir."""
    from rollstack_corpus.bugs import unified_diff

    names = draw(st.lists(NAMES, min_size=1, max_size=4, unique=True))
    files = {n: _text(draw(LINES)) for n in names}
    parts = []
    for n, before in files.items():
        action = draw(st.sampled_from(["modify", "delete", "keep"]))
        if action == "modify":
            after = _text(draw(LINES))
            if after != before:
                parts.append(unified_diff(n, before, after))
        elif action == "delete":
            parts.append(_diff_delete(n, before))
    for n in draw(st.lists(st.sampled_from(["new/x.txt", "new.txt", "pkg/new.py"]), max_size=2, unique=True)):
        if n not in files:
            parts.append(_diff_new(n, _text(draw(LINES)), draw(st.sampled_from(["100644", "100755"]))))
    if not parts:
        parts.append(_diff_new("only.txt", "one\n"))
    return files, "".join(parts)


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / "work" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def _snapshot(root: Path) -> dict[str, tuple]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st_ = os.lstat(p)
            data = p.read_bytes() if p.is_file() and not p.is_symlink() else None
            out[str(p.relative_to(root))] = (st_.st_mode, data)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases())
def test_one_plan_written_n_times_equals_n_applies(case) -> None:
    files, diff = case
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        separate, shared = [base / f"s{i}" for i in range(3)], [base / f"g{i}" for i in range(3)]
        for root in separate + shared:
            _tree(root, files)
        for root in separate:
            apply_mutation(root, diff, workdir="/work")
        plan = plan_mutation(shared[0], diff, workdir="/work")
        for root in shared:
            write_mutation(root, plan)
        _tree(base / "orig", files)
        want = _snapshot(separate[0])
        assert want != _snapshot(base / "orig")  # the diff changed something
        for root in separate[1:] + shared:
            assert _snapshot(root) == want


def test_planning_touches_nothing_and_the_plan_is_reusable(tmp_path: Path) -> None:
    from rollstack_corpus.bugs import unified_diff

    _tree(tmp_path / "a", {"m.py": "x = 1\n"})
    before = _snapshot(tmp_path / "a")
    plan = plan_mutation(tmp_path / "a", unified_diff("m.py", "x = 1\n", "x = 2\n"), workdir="/work")
    assert _snapshot(tmp_path / "a") == before and plan.files_changed == 1
    for name in ("a", "b", "c"):
        if name != "a":
            _tree(tmp_path / name, {"m.py": "x = 1\n"})
        write_mutation(tmp_path / name, plan)
        assert (tmp_path / name / "work/m.py").read_text() == "x = 2\n"


def test_a_plan_is_checked_again_in_each_root(tmp_path: Path) -> None:
    """The plan came from a clean tree; a root where the file's directory is a symlink out of
    it is refused, and left as it was (nothing staged stays behind)."""
    good, bad, outside = tmp_path / "good", tmp_path / "bad", tmp_path / "outside"
    _tree(good, {"pkg/m.py": "a\n"})
    outside.mkdir()
    (bad / "work").mkdir(parents=True)
    os.symlink("../../../outside", bad / "work" / "pkg")  # climbs out of `bad`
    plan = plan_mutation(good, _diff_new("pkg/new.py", "n\n"), workdir="/work")
    before = _snapshot(bad)
    with pytest.raises((UnsafePath, MutationFailed)):
        write_mutation(bad, plan)
    assert _snapshot(bad) == before and list(outside.iterdir()) == []


def test_a_failed_write_leaves_no_partial_files(tmp_path: Path) -> None:
    """Two new files; the second's directory is a plain file in this root: MutationFailed and
    the first file's staged copy is gone too."""
    good, bad = tmp_path / "good", tmp_path / "bad"
    _tree(good, {"keep.txt": "k\n"})
    _tree(bad, {"keep.txt": "k\n", "zdir": "not a directory\n"})
    diff = _diff_new("a.txt", "a\n") + _diff_new("zdir/b.txt", "b\n")
    plan = plan_mutation(good, diff, workdir="/work")
    before = _snapshot(bad)
    with pytest.raises(MutationFailed):
        write_mutation(bad, plan)
    assert _snapshot(bad) == before
    shutil.rmtree(good)
