"""apply_mutation against `git apply` on real trees: git makes the diff, ours must reproduce git's tree."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rollstack.errors import MutationFailed, UnsafePath
from rollstack.plan.mutation import apply_mutation

pytestmark = pytest.mark.integration


def git(repo: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True).stdout


def snapshot(root: Path) -> dict[str, tuple]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir",)
            else:
                out[rel] = ("file", p.read_bytes(), os.stat(p).st_mode & 0o111 != 0)
    return out


def make_repo(path: Path) -> Path:
    path.mkdir()
    git(path, "init", "-q")
    git(path, "config", "user.email", "t@example.com")
    git(path, "config", "user.name", "t")
    git(path, "config", "core.autocrlf", "false")
    return path


def commit_all(repo: Path) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "x", "--allow-empty")


def diff_and_reset(repo: Path, tmp: Path) -> tuple[bytes, dict]:
    """The staged change as a git diff, git's resulting tree, and the repo reset to HEAD."""
    git(repo, "add", "-A")
    patch = git(repo, "diff", "--cached", "--binary", "-M")
    expected = snapshot(repo)
    git(repo, "reset", "-q", "--hard")
    git(repo, "clean", "-qfdx")
    return patch, expected


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = make_repo(tmp_path / "repo")
    (r / "src").mkdir()
    (r / "src/mod.py").write_text("".join(f"def f{i}():\n    return {i}\n\n" for i in range(60)))
    (r / "README.md").write_text("# title\n\nsome text\n")
    (r / "noeol.txt").write_bytes(b"a\nb\nc")
    (r / "crlf.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    (r / "blob.bin").write_bytes(bytes(random.Random(1).randrange(256) for _ in range(5000)))
    (r / "gone.txt").write_text("bye\n")
    (r / "deep/a/b").mkdir(parents=True)
    (r / "deep/a/b/only.txt").write_text("only\n")
    (r / "tool.sh").write_text("#!/bin/sh\necho hi\n")
    os.symlink("README.md", r / "readme-link")
    commit_all(r)
    return r


def test_all_kinds_of_change_match_git(repo: Path, tmp_path: Path) -> None:
    mod = (repo / "src/mod.py").read_text().replace("return 3\n", "return 33\n").replace("return 50\n", "return -50\n")
    (repo / "src/mod.py").write_text(mod + "def tail():\n    pass\n")
    (repo / "noeol.txt").write_bytes(b"a\nB\nc\n")
    (repo / "crlf.txt").write_bytes(b"one\r\nTWO\r\nthree\r\n")
    data = bytearray((repo / "blob.bin").read_bytes())
    data[10:20] = b"x" * 10
    (repo / "blob.bin").write_bytes(bytes(data))
    (repo / "new.bin").write_bytes(bytes(range(256)) * 3)
    (repo / "gone.txt").unlink()
    shutil.rmtree(repo / "deep")
    (repo / "tool.sh").chmod(0o755)
    (repo / "src/mod.py").rename(repo / "src/moved.py")
    (repo / "src/brand/new").mkdir(parents=True)
    (repo / "src/brand/new/file.py").write_text("x = 1\n")
    (repo / "empty").write_text("")
    (repo / "readme-link").unlink()
    os.symlink("noeol.txt", repo / "readme-link")
    os.symlink("src/moved.py", repo / "new-link")
    patch, expected = diff_and_reset(repo, tmp_path)
    assert b"GIT binary patch" in patch and b"rename from" in patch

    result = apply_mutation(repo, patch)

    assert snapshot(repo) == expected
    assert result.files_changed == patch.count(b"diff --git ")


def test_copies_match_git(repo: Path, tmp_path: Path) -> None:
    text = (repo / "src/mod.py").read_text()
    (repo / "src/copy.py").write_text(text.replace("return 20\n", "return 2000\n"))
    git(repo, "add", "-A")
    patch = git(repo, "diff", "--cached", "--binary", "-C", "--find-copies-harder")
    assert b"copy from src/mod.py" in patch
    expected = snapshot(repo)
    git(repo, "reset", "-q", "--hard")
    git(repo, "clean", "-qfdx")
    apply_mutation(repo, patch)
    assert snapshot(repo) == expected


def test_paths_are_relative_to_workdir(tmp_path: Path) -> None:
    r = make_repo(tmp_path / "repo")
    (r / "f.txt").write_text("1\n2\n3\n")
    commit_all(r)
    (r / "f.txt").write_text("1\ntwo\n3\n")
    patch, expected = diff_and_reset(r, tmp_path)
    root = tmp_path / "root"
    shutil.copytree(r, root / "work/proj")
    apply_mutation(root, patch, workdir="/work/proj")
    assert (root / "work/proj/f.txt").read_text() == "1\ntwo\n3\n"


def test_hunk_applies_at_an_offset_like_git(repo: Path, tmp_path: Path) -> None:
    text = (repo / "src/mod.py").read_text()
    (repo / "src/mod.py").write_text(text.replace("return 30\n", "return 300\n"))
    patch, _ = diff_and_reset(repo, tmp_path)
    # shift the file by some lines: exact context still matches elsewhere
    (repo / "src/mod.py").write_text("# header\n# more\n" + text)
    expected = "# header\n# more\n" + text.replace("return 30\n", "return 300\n")
    apply_mutation(repo, patch)
    assert (repo / "src/mod.py").read_text() == expected


@pytest.mark.parametrize("break_it", ["context", "missing", "exists", "binary"])
def test_patches_that_do_not_apply_change_nothing(repo: Path, tmp_path: Path, break_it: str) -> None:
    (repo / "README.md").write_text("# title\n\nother text\n")
    (repo / "src/mod.py").write_text((repo / "src/mod.py").read_text().replace("return 7\n", "return 8\n"))
    (repo / "added.txt").write_text("added\n")
    data = bytearray((repo / "blob.bin").read_bytes())
    data[0] ^= 0xFF
    (repo / "blob.bin").write_bytes(bytes(data))
    patch, _ = diff_and_reset(repo, tmp_path)
    if break_it == "context":
        (repo / "src/mod.py").write_text((repo / "src/mod.py").read_text().replace("def f7", "def g7"))
    elif break_it == "missing":
        (repo / "src/mod.py").unlink()
    elif break_it == "exists":
        (repo / "added.txt").write_text("already\n")
    else:
        (repo / "blob.bin").write_bytes(b"different base")
    before = snapshot(repo)
    proc = subprocess.run(["git", "-C", str(repo), "apply", "--check", "-"], input=patch, capture_output=True)
    assert proc.returncode != 0  # git agrees it does not apply

    with pytest.raises(MutationFailed) as info:
        apply_mutation(repo, patch)

    assert snapshot(repo) == before  # nothing half-applied (README.md sorts before the failure)
    if break_it == "context":
        assert "src/mod.py" in info.value.message and "hunk #1" in info.value.message


@pytest.mark.parametrize(
    "path",
    ["../escape.txt", "/etc/passwd", "a/../../x", "through-link/pwned.txt"],
)
def test_hostile_paths_are_rejected(tmp_path: Path, path: str) -> None:
    root = tmp_path / "root"
    (root / "w").mkdir(parents=True)
    os.symlink("../../..", root / "w/through-link")
    diff = f"--- a/{path}\n+++ b/{path}\n@@ -0,0 +1 @@\n+pwned\n"
    with pytest.raises(UnsafePath):
        apply_mutation(root, diff, workdir="/w")
    assert not any(p.name == "pwned.txt" for p in tmp_path.rglob("*"))


def test_absolute_symlinks_resolve_inside_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "srv/real").mkdir(parents=True)
    (root / "srv/real/f.txt").write_text("old\n")
    (root / "work").mkdir()
    os.symlink("/srv/real", root / "work/proj")  # would point outside on the host
    diff = "--- a/proj/f.txt\n+++ b/proj/f.txt\n@@ -1 +1 @@\n-old\n+new\n"
    apply_mutation(root, diff, workdir="/work")
    assert (root / "srv/real/f.txt").read_text() == "new\n"


def test_empty_and_garbage_diffs(tmp_path: Path) -> None:
    assert apply_mutation(tmp_path, "").files_changed == 0
    with pytest.raises(MutationFailed):
        apply_mutation(tmp_path, "this is not a diff\n")


LINES = st.lists(st.sampled_from(["a", "b", "c", "", "  x = 1", "return y", "}"]), min_size=0, max_size=30)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=LINES, edits=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 3), LINES.map(lambda l: l[:3])), max_size=4),
       eol=st.booleans())
def test_random_text_edits_match_git(tmp_path_factory: pytest.TempPathFactory, before: list[str],
                                     edits: list[tuple[int, int, list[str]]], eol: bool) -> None:
    r = make_repo(tmp_path_factory.mktemp("h") / "repo")
    text = "\n".join(before) + ("\n" if before else "")
    (r / "f.txt").write_text(text)
    commit_all(r)
    lines = list(before)
    for at, remove, insert in edits:
        at = min(at, len(lines))
        lines[at : at + remove] = insert
    (r / "f.txt").write_text("\n".join(lines) + ("\n" if eol and lines else ""))
    patch, expected = diff_and_reset(r, tmp_path_factory.getbasetemp())
    apply_mutation(r, patch)
    assert snapshot(r) == expected


def test_owners_are_kept(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "home/agent/repo").mkdir(parents=True)
    os.chown(root / "home/agent/repo", 1000, 1000)
    f = root / "home/agent/repo/f.txt"
    f.write_text("a\n")
    os.chown(f, 1000, 1001)
    diff = ("--- a/f.txt\n+++ b/f.txt\n@@ -1 +1 @@\n-a\n+b\n"
            "diff --git a/sub/new.txt b/sub/new.txt\nnew file mode 100644\n--- /dev/null\n+++ b/sub/new.txt\n@@ -0,0 +1 @@\n+n\n")
    apply_mutation(root, diff, workdir="/home/agent/repo")
    st_f = os.stat(f)
    assert (st_f.st_uid, st_f.st_gid) == (1000, 1001) and f.read_text() == "b\n"
    st_new = os.stat(root / "home/agent/repo/sub/new.txt")
    assert (st_new.st_uid, st_new.st_gid) == (1000, 1000)
