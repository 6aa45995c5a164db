"""upper_diff against real overlayfs: random edits through the merged dir, the diff applied with
`git apply` onto the original (lower) tree must reproduce the merged tree exactly."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rollstack.run.diff import upper_diff
from rollstack.run.lowerview import OPAQUE_XATTR, LowerView
from rollstack.run.overlay import mount_overlay, unmount

pytestmark = pytest.mark.integration

PATHS = ["a", "b.txt", "d", "d/x", "d/y", "d/e", "d/e/z", "f w.txt", "q\"t", "ü.txt"]
lines = st.lists(st.sampled_from(["alpha", "beta", "gamma", "", "  indented", "tab\there",
                                  "cr\rinside", "form\x0cfeed"]), max_size=12)
texts = st.builds(lambda ls, nl: "\n".join(ls) + ("\n" if nl and ls else ""), lines, st.booleans())
binaries = st.binary(max_size=300).map(lambda b: b"\x00" + b)
ops = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(PATHS), texts),
    st.tuples(st.just("delete"), st.sampled_from(PATHS)),
    st.tuples(st.just("chmod"), st.sampled_from(PATHS)),
    st.tuples(st.just("symlink"), st.sampled_from(PATHS), st.sampled_from(["a", "d/x", "nowhere"])),
    st.tuples(st.just("rename"), st.sampled_from(PATHS), st.sampled_from(PATHS)),
    st.tuples(st.just("mkdir"), st.sampled_from(PATHS)),
    st.tuples(st.just("write"), st.sampled_from(PATHS), binaries),
)


def apply_op(root: Path, op: tuple) -> None:
    kind, path = op[0], root / op[1]
    try:
        if kind == "write":
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(op[2], bytes):
                path.write_bytes(op[2])
            else:
                path.write_text(op[2])
        elif kind == "delete":
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        elif kind == "chmod":
            if path.is_file() and not path.is_symlink():
                path.chmod(path.stat().st_mode ^ 0o111)
        elif kind == "symlink":
            path.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(op[2], path)
        elif kind == "rename":
            os.rename(path, root / op[2])
        elif kind == "mkdir":
            path.mkdir(parents=True)
    except OSError:
        pass  # an op that does not apply to the current tree is a no-op


def snapshot(root: Path) -> dict[str, tuple]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if rel.startswith(".git"):
                continue
            try:
                st_ = os.lstat(p)
            except FileNotFoundError:
                # overlay lists a lower-layer whiteout in a dir no other layer has, yet a
                # lookup of it fails: the name does not exist.
                continue
            if stat.S_ISLNK(st_.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISREG(st_.st_mode):
                out[rel] = ("file", p.read_bytes(), bool(st_.st_mode & stat.S_IXUSR))
    return out


def materialize(view: LowerView, dst: Path, rel: str = "") -> None:
    for name in view.listdir(rel):
        child = f"{rel}/{name}" if rel else name
        e = view.entry(child)
        target = dst / child
        if e.kind == "dir":
            target.mkdir()
            materialize(view, dst, child)
        elif e.kind == "symlink":
            os.symlink(os.readlink(e.host_path), target)
        elif e.kind == "file":
            shutil.copyfile(e.host_path, target)
            target.chmod(e.mode)


def build_layer(root: Path, files: dict[str, str]) -> None:
    root.mkdir()
    for rel, text in files.items():
        p = root / rel
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(text) if isinstance(text, bytes) else p.write_text(text)
        except OSError:
            pass


def git_apply(tree: Path, patch: str) -> None:
    if not patch:
        return
    proc = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], cwd=tree,
                          input=patch.encode(), capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode() + "\n" + patch


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bottom=st.dictionaries(st.sampled_from(PATHS), texts | binaries, max_size=6),
       top=st.dictionaries(st.sampled_from(PATHS), texts, max_size=4),
       whiteouts=st.lists(st.sampled_from(PATHS), max_size=2),
       opaque_d=st.booleans(),
       edits=st.lists(ops, max_size=10))
def test_diff_applies_to_original_and_reproduces_merged(tmp_path_factory, bottom, top, whiteouts,
                                                        opaque_d, edits):
    base = tmp_path_factory.mktemp("ovl")
    l2, l1 = base / "l2", base / "l1"
    build_layer(l2, bottom)
    build_layer(l1, top)
    for w in whiteouts:  # overlay-format deletions in the top lower layer
        p = l1 / w
        if not p.exists() and not p.is_symlink() and p.parent.is_dir():
            os.mknod(p, stat.S_IFCHR | 0o000, os.makedev(0, 0))
    if opaque_d and (l1 / "d").is_dir():
        os.setxattr(l1 / "d", OPAQUE_XATTR, b"y")
    for d in ("upper", "work", "merged", "orig"):
        (base / d).mkdir()
    lowers = [l1, l2]
    mount_overlay(lowers, base / "upper", base / "work", base / "merged")
    try:
        before = snapshot(base / "merged")
        materialize(LowerView(lowers), base / "orig")
        assert snapshot(base / "orig") == before  # LowerView reads like the overlay
        for op in edits:
            apply_op(base / "merged", op)
        after = snapshot(base / "merged")
    finally:
        unmount(base / "merged")
    patch = upper_diff(base / "upper", LowerView(lowers), binary="patch")
    git_apply(base / "orig", patch)
    assert snapshot(base / "orig") == after, patch
    shutil.rmtree(base)


def test_diff_relative_to_workdir_excludes_noise_and_names_binaries(tmp_path: Path):
    lower = tmp_path / "lower"
    (lower / "work/pkg").mkdir(parents=True)
    (lower / "work/pkg/mod.py").write_text("x = 1\n")
    (lower / "work/blob.bin").write_bytes(b"\x00\x01old")
    (lower / "etc").mkdir()
    (lower / "etc/conf").write_text("c\n")
    for d in ("upper", "work", "merged"):
        (tmp_path / d).mkdir()
    mount_overlay([lower], tmp_path / "upper", tmp_path / "work", tmp_path / "merged")
    m = tmp_path / "merged"
    try:
        (m / "work/pkg/mod.py").write_text("x = 2\n")
        (m / "work/blob.bin").write_bytes(b"\x00\x01new")
        (m / "work/pkg/__pycache__").mkdir()
        (m / "work/pkg/__pycache__/mod.cpython-311.pyc").write_bytes(b"\x00pyc")
        (m / "tmp").mkdir()
        (m / "tmp/scratch").write_text("noise\n")
        (m / "etc/conf").write_text("changed\n")
    finally:
        unmount(m)
    full = upper_diff(tmp_path / "upper", LowerView([lower]))
    assert "a/etc/conf" in full and "tmp/scratch" not in full and "__pycache__" not in full
    rel = upper_diff(tmp_path / "upper", LowerView([lower]), base="/work")
    assert "etc/conf" not in rel
    assert "diff --git a/pkg/mod.py b/pkg/mod.py\n" in rel
    assert "-x = 1\n+x = 2\n" in rel
    assert "Binary files a/blob.bin and b/blob.bin differ\n" in rel
    everything = upper_diff(tmp_path / "upper", LowerView([lower]), excludes=())
    assert "tmp/scratch" in everything and "__pycache__" in everything
