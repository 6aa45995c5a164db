"""Reading the layer stack as it was before the environment wrote anything: `LowerView`.

Lower dirs are looked up top-first with overlayfs' rules, so any stack of plain directories
(tests) or FUSE-served layer dirs (production) reads like the overlay without its upper:
- a character device 0/0 is a whiteout: the name is deleted from every layer below;
- a directory with xattr `trusted.overlay.opaque` = "y" hides the same directory in the layers
  below it;
- a non-directory in a higher layer hides whatever a lower layer has at and under that name.
Redirects (`trusted.overlay.redirect`) and metacopy are not used by rollstack and not handled.
"""

from __future__ import annotations

import os
import stat as statmod
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol

OPAQUE_XATTR = "trusted.overlay.opaque"


@dataclass(frozen=True)
class Entry:
    """One path's entry in a layer: `kind` is file | dir | symlink | other."""

    kind: str
    mode: int
    host_path: Path

    def read(self) -> bytes:
        if self.kind == "symlink":
            return os.fsencode(os.readlink(self.host_path))
        return self.host_path.read_bytes()


class LowerReader(Protocol):
    """What `upper_diff` needs from "the stack without the upper"."""

    def entry(self, rel: str) -> Entry | None:
        """The entry at `rel` (no leading slash; "" is the root), or None if absent/deleted."""

    def listdir(self, rel: str) -> list[str]:
        """Merged names in directory `rel` (empty if it is not a directory)."""


def is_whiteout(st: os.stat_result) -> bool:
    return statmod.S_ISCHR(st.st_mode) and st.st_rdev == 0


def is_opaque(path: Path) -> bool:
    try:
        return os.getxattr(path, OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False


def kind_of(mode: int) -> str:
    if statmod.S_ISREG(mode):
        return "file"
    if statmod.S_ISDIR(mode):
        return "dir"
    if statmod.S_ISLNK(mode):
        return "symlink"
    return "other"


def _lstat(p: Path) -> os.stat_result | None:
    try:
        return os.lstat(p)
    except (FileNotFoundError, NotADirectoryError):
        return None


class LowerView:
    """A read-only merged view of lower dirs (top first)."""

    def __init__(self, lowers: list[Path]) -> None:
        self.lowers = [Path(p) for p in lowers]

    @staticmethod
    def _blocked_below(layer: Path, parts: list[str]) -> bool:
        """Whether `layer` hides lower layers for `parts` at some ancestor (whiteout, non-dir,
        or opaque dir)."""
        cur = layer
        for part in parts[:-1] if parts else []:
            cur = cur / part
            st = _lstat(cur)
            if st is None:
                return False
            if not statmod.S_ISDIR(st.st_mode):
                return True
            if is_opaque(cur):
                return True
        return False

    def entry(self, rel: str) -> Entry | None:
        parts = [p for p in rel.split("/") if p]
        if not parts:
            return Entry("dir", 0o755, self.lowers[0]) if self.lowers else None
        for layer in self.lowers:
            cur = layer
            for part in parts:
                cur = cur / part
            st = _lstat(cur)
            if st is not None:  # (an ancestor that is a non-dir makes lstat fail: None)
                if is_whiteout(st):
                    return None
                return Entry(kind_of(st.st_mode), statmod.S_IMODE(st.st_mode), cur)
            if self._blocked_below(layer, parts + [""]):
                return None
        return None

    def listdir(self, rel: str) -> list[str]:
        parts = [p for p in rel.split("/") if p]
        names: dict[str, bool] = {}  # name -> visible
        for layer in self.lowers:
            cur = layer
            for part in parts:
                cur = cur / part
            if self._blocked_below(layer, parts + [""]) and _lstat(cur) is None:
                break
            st = _lstat(cur)
            if st is None:
                continue
            if not statmod.S_ISDIR(st.st_mode):
                break
            for name in os.listdir(cur):
                if name in names:
                    continue
                cst = _lstat(cur / name)
                names[name] = cst is not None and not is_whiteout(cst)
            if is_opaque(cur):
                break
        return sorted(n for n, visible in names.items() if visible)

    def walk_files(self, rel: str = "") -> Iterator[str]:
        """Every non-directory path at or under `rel` (depth first, sorted)."""
        e = self.entry(rel)
        if e is None:
            return
        if e.kind != "dir":
            yield rel
            return
        for name in self.listdir(rel):
            yield from self.walk_files(f"{rel}/{name}" if rel else name)

