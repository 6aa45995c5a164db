"""Oracle: LayerStack's composition must equal the kernel's overlayfs over the same layers.

Random stacks of 2-4 small layers (dirs, files, symlinks, hardlinks, whiteouts, opaque dirs) are
unpacked into directories in overlay format (whiteouts: 0/0 char devices; opaque directories:
`trusted.overlay.opaque=y`), mounted read-only with `mount -t overlay`, and compared with
`LayerStack` entry by entry: names, types, modes, sizes, link targets, contents.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import uuid
from pathlib import Path

import pytest
from components import need
from hypothesis import HealthCheck, given, settings, strategies as st

from rollstack.format.toc import EntryType, Toc, TocEntry
from rollstack.plan.stack import LayerStack

pytestmark = pytest.mark.integration

NAMES = ["a", "b", "c"]
MODES = [0o755, 0o700, 0o644, 0o600, 0o750]


def _can_overlay() -> str | None:
    if os.geteuid() != 0:
        return "needs root to mount overlayfs"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "kernel without overlayfs"
    return None


@st.composite
def layer_tree(draw: st.DrawFn, prefix: str = "", depth: int = 0) -> dict[str, tuple]:
    """{path: spec} for one layer; every parent of a path is a dir of the same layer."""
    out: dict[str, tuple] = {}
    for name in draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=3)):
        path = f"{prefix}{name}"
        kinds = ["file", "symlink", "whiteout", "dir", "opaque"] if depth < 2 else ["file", "symlink", "whiteout"]
        kind = draw(st.sampled_from(kinds))
        if kind == "file":
            out[path] = ("file", draw(st.binary(max_size=40)), draw(st.sampled_from([0o644, 0o600, 0o755])))
        elif kind == "symlink":
            out[path] = ("symlink", draw(st.sampled_from(["a", "../b", "/a/c", "missing", "."])))
        elif kind == "whiteout":
            out[path] = ("whiteout",)
        else:
            out[path] = ("dir", draw(st.sampled_from(MODES)), kind == "opaque")
            out.update(draw(layer_tree(prefix=path + "/", depth=depth + 1)))
    files = [p for p, s in out.items() if s[0] == "file"]
    if files and draw(st.booleans()):  # a hardlink next to its target
        target = draw(st.sampled_from(files))
        link = f"{target}-hl"
        out[link] = ("hardlink", target)
    return out


def to_toc(spec: dict[str, tuple]) -> list[TocEntry]:
    entries = []
    for path, s in spec.items():
        if s[0] == "file":
            entries.append(TocEntry(path, EntryType.REG, mode=s[2], size=len(s[1])))
        elif s[0] == "symlink":
            entries.append(TocEntry(path, EntryType.SYMLINK, mode=0o777, link=s[1]))
        elif s[0] == "whiteout":
            entries.append(TocEntry(path, EntryType.WHITEOUT, mode=0))
        elif s[0] == "hardlink":
            entries.append(TocEntry(path, EntryType.HARDLINK, link=s[1]))
        else:
            entries.append(TocEntry(path, EntryType.DIR, mode=s[1], opaque=s[2]))
    return entries


def unpack(spec: dict[str, tuple], dest: Path) -> None:
    dest.mkdir(mode=0o755)
    for path in sorted(spec, key=lambda p: p.split("/")):
        s, target = spec[path], dest / path
        if s[0] == "file":
            target.write_bytes(s[1])
            target.chmod(s[2])
        elif s[0] == "symlink":
            os.symlink(s[1], target)
        elif s[0] == "whiteout":
            os.mknod(target, stat.S_IFCHR | 0o000, os.makedev(0, 0))
        elif s[0] == "hardlink":
            continue  # below, once its target exists
        else:
            target.mkdir()
            target.chmod(s[1])
            if s[2]:
                os.setxattr(target, "trusted.overlay.opaque", b"y")
    for path, s in spec.items():
        if s[0] == "hardlink":
            os.link(dest / s[1], dest / path)
    # directory modes such as 0o600 would stop us writing children; set them last
    for path, s in spec.items():
        if s[0] == "dir":
            (dest / path).chmod(s[1])


def kernel_tree(root: Path) -> dict[str, tuple]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = str(p.relative_to(root))
            try:
                st_ = os.lstat(p)
            except FileNotFoundError:
                # A whiteout in a directory no lower layer has: readdir of that unmerged directory
                # still lists it, but lookup (what every path operation uses) says ENOENT. The
                # name does not exist, which is what LayerStack says too.
                continue
            if stat.S_ISLNK(st_.st_mode):
                out[rel] = ("symlink", os.readlink(p))
            elif stat.S_ISDIR(st_.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st_.st_mode))
            elif stat.S_ISREG(st_.st_mode):
                out[rel] = ("reg", stat.S_IMODE(st_.st_mode), st_.st_size, p.read_bytes())
            else:
                out[rel] = ("other", st_.st_mode)
    return out


def stack_tree(stack: LayerStack, specs: list[dict[str, tuple]]) -> dict[str, tuple]:
    out = {}
    for path, layer, entry in stack.walk():
        if path == "":
            continue
        if entry.type == EntryType.SYMLINK:
            out[path] = ("symlink", entry.link)
        elif entry.type == EntryType.DIR:
            out[path] = ("dir", entry.mode)
        elif entry.type == EntryType.REG:
            content = specs[layer][entry.path][1]  # entry.path: the hardlink target's path
            out[path] = ("reg", entry.mode, entry.size, content)
        else:
            out[path] = ("other", entry.type)
    return out


@pytest.fixture
def workspace(tmp_path: Path):
    reason = _can_overlay()
    need(not reason, str(reason))
    base = tmp_path / f"ovl-{uuid.uuid4().hex[:8]}"
    base.mkdir()
    mounted: list[Path] = []
    yield base, mounted
    for mnt in mounted:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
    shutil.rmtree(base, ignore_errors=True)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(layer_tree(), min_size=2, max_size=4))
def test_layerstack_matches_kernel_overlayfs(workspace, specs: list[dict[str, tuple]]) -> None:
    base, mounted = workspace
    run = base / uuid.uuid4().hex[:8]
    run.mkdir()
    lowers = []
    for i, spec in enumerate(specs):
        unpack(spec, run / f"l{i}")
        lowers.append(str(run / f"l{i}"))
    mnt = run / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", "lowerdir=" + ":".join(reversed(lowers)), str(mnt)],
                   check=True, capture_output=True)
    mounted.append(mnt)
    try:
        expected = kernel_tree(mnt)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
        mounted.remove(mnt)

    stack = LayerStack([Toc(to_toc(spec)) for spec in specs])  # Toc: the code-point-sorted fast path

    assert stack_tree(stack, specs) == expected


def test_overlay_rules_by_example(workspace) -> None:
    """A fixed stack exercising every rule once, so a failure reads plainly."""
    specs = [
        {"etc": ("dir", 0o755, False), "etc/keep": ("file", b"k", 0o644), "etc/gone": ("file", b"g", 0o644),
         "opt": ("dir", 0o755, False), "opt/old": ("file", b"o", 0o644),
         "lib": ("dir", 0o755, False), "lib/x": ("file", b"x", 0o644)},
        {"etc": ("dir", 0o700, False), "etc/gone": ("whiteout",), "etc/new": ("file", b"n", 0o600),
         "opt": ("dir", 0o755, True), "opt/fresh": ("file", b"f", 0o644),
         "lib": ("symlink", "opt"), "etc/hl": ("hardlink", "etc/new")},
    ]
    base, mounted = workspace
    for i, spec in enumerate(specs):
        unpack(spec, base / f"l{i}")
    mnt = base / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={base}/l1:{base}/l0", str(mnt)], check=True)
    mounted.append(mnt)
    try:
        expected = kernel_tree(mnt)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
        mounted.remove(mnt)
    stack = LayerStack([to_toc(s) for s in specs])
    got = stack_tree(stack, specs)
    assert got == expected
    assert sorted(got) == ["etc", "etc/hl", "etc/keep", "etc/new", "lib", "opt", "opt/fresh"]
