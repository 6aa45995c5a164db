"""Helpers for the lazy store's real-FUSE tests: a rootfs-like tree, publishing, overlay mounts."""

from __future__ import annotations

import errno
import hashlib
import os
import random
import shutil
import stat
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from rollstack.format import convert

PY = Path("/usr/lib/python3.11")


def build_tree(root: Path, *, big_mib: int = 3) -> Path:
    """A small but rootfs-like tree: real stdlib files plus every entry type a layer can hold."""
    root.mkdir(parents=True)
    for pkg in ("json", "email", "logging", "http"):
        shutil.copytree(PY / pkg, root / "usr/lib/python3/" / pkg, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    etc = root / "etc"
    etc.mkdir()
    (etc / "hostname").write_text("rollstack\n")
    (etc / "empty").write_bytes(b"")
    (etc / "secret").write_text("s3cret\n")
    os.chmod(etc / "secret", 0o600)
    os.chown(etc / "secret", 1234, 5678)
    rnd = random.Random(7)
    big = bytes(rnd.getrandbits(8) for _ in range(256 << 10)) * (big_mib * 4)  # multi-chunk, compressible
    (root / "big.bin").write_bytes(big + b"tail")
    (root / "incompressible.bin").write_bytes(os.urandom((1 << 20) + 12345))
    bin_ = root / "usr/bin"
    bin_.mkdir(parents=True)
    (bin_ / "tool").write_text("#!/bin/sh\necho tool\n")
    os.chmod(bin_ / "tool", 0o4755)
    os.link(bin_ / "tool", bin_ / "tool-hardlink")
    os.link(bin_ / "tool", root / "etc/tool-link2")
    os.symlink("tool", bin_ / "tool-symlink")
    os.symlink("/etc/hostname", root / "abs-symlink")
    os.symlink("does/not/exist", root / "dangling")
    dev = root / "dev"
    dev.mkdir()
    os.mknod(dev / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.mkfifo(dev / "fifo")
    os.setxattr(etc / "hostname", "user.rollstack", b"hello")
    (root / "deep/a/b/c/d").mkdir(parents=True)
    (root / "deep/a/b/c/d/leaf.txt").write_text("leaf\n")
    return root


def publish(store, src: Path, blob: Path, repo: str) -> str:
    """Convert `src` and put the blob in `store`; returns its digest."""
    info = convert(src, blob)
    digest = "sha256:" + hashlib.sha256(blob.read_bytes()).hexdigest()
    assert digest == info.digest
    store.put_blob(repo, digest, blob)
    return digest


def walk(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            yield Path(dirpath) / name


@contextmanager
def overlay(lowers: list[Path], work: Path) -> Iterator[Path]:
    """An overlayfs over `lowers` (top first) with a private upper; always unmounted."""
    upper, wd, merged = work / "upper", work / "work", work / "merged"
    for d in (upper, wd, merged):
        d.mkdir(parents=True)
    opts = f"lowerdir={':'.join(str(p) for p in lowers)},upperdir={upper},workdir={wd}"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(merged)], check=True)
    try:
        yield merged
    finally:
        subprocess.run(["umount", "-l", str(merged)], check=False)


def read_errno(path: Path) -> int:
    try:
        path.read_bytes()
    except OSError as exc:
        return exc.errno or 0
    return 0


__all__ = ["build_tree", "publish", "walk", "overlay", "read_errno", "errno"]


CGROUP_ROOT = Path("/sys/fs/cgroup/pids")
FILES = ["usr/lib/python3/json/decoder.py", "usr/lib/python3/json/encoder.py", "usr/lib/python3/email/parser.py",
         "usr/lib/python3/logging/__init__.py", "big.bin"]


def run_in(cgroup: Path, argv: list[str]) -> bytes:
    """Runs argv inside `cgroup`, so the daemon attributes its reads to that environment."""
    def enter() -> None:
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))

    return subprocess.run(argv, preexec_fn=enter, check=True, capture_output=True).stdout
