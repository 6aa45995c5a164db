"""`LayerStack`: the root namespace of a stack of layer TOCs, composed as overlayfs would.

Pure: it reads TOCs, never bytes. Rules (the kernel's overlayfs, checked by an oracle test
against real `mount -t overlay`):
- layers are given bottom first; a higher layer's entry at a path overrides a lower one's;
- a directory over a directory merges (the higher one's attributes win); any other override
  hides the lower entry, and with it the lower directory's whole subtree;
- a whiteout deletes the path (and its subtree) from the layers below; it is not itself visible;
- an opaque directory hides everything below it in lower layers (its own layer's children stay);
- a hardlink resolves to its target entry in the same layer (so `lookup` returns the entry to
  read bytes from: its `path` is the target's, which may differ from the path looked up);
- symlinks are entries; `resolve()` follows them as the kernel would inside a chroot at "/"
  (absolute targets start at the stack root, ".." stops at the root, at most 40 links).
Paths may be given as "/a/b", "a/b" or "a/b/"; "" and "/" are the root.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from rollstack.errors import FormatError
from rollstack.format.toc import EntryType, TocEntry

MAX_SYMLINKS = 40  # Linux's MAXSYMLINKS
_ROOT = TocEntry(path="", type=EntryType.DIR, mode=0o755)


def norm(path: str) -> str:
    """TOC form: no leading/trailing '/', no '.' components ('..' is kept for callers to judge)."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    return "/".join(parts)


def _depth_key(path: str) -> tuple[str, ...]:
    return tuple(path.split("/")) if path else ()


def _ordered(toc: Any) -> list[tuple[str, TocEntry]]:
    """(path, entry) with every parent before its children.

    A `Toc` is already normalised and sorted by code point, where a parent (a prefix) sorts
    before its children; plain lists are normalised and sorted here."""
    if hasattr(toc, "entries"):
        return [(e.path, e) for e in toc.entries]
    by_path = {norm(e.path): e for e in toc}
    return [(p, by_path[p]) for p in sorted(by_path, key=_depth_key)]


class LayerStack:
    """The merged view of `tocs` (bottom first). Built once, O(total entries); lookups are O(1)."""

    def __init__(self, tocs: Sequence[Any]) -> None:
        self.depth = len(tocs)
        self._map: dict[str, tuple[int, TocEntry]] = {"": (-1, _ROOT)}
        self._children: dict[str, set[str]] = {"": set()}
        for index, toc in enumerate(tocs):
            self._add_layer(index, _ordered(toc))
        self._sorted: dict[str, list[str]] = {}

    # -- composition -------------------------------------------------------------------------
    def _add_layer(self, index: int, entries: list[tuple[str, TocEntry]]) -> None:
        by_path: dict[str, TocEntry] | None = None
        for path, entry in entries:
            if entry.type == EntryType.HARDLINK:
                if by_path is None:
                    by_path = dict(entries)
                entry = self._hardlink_target(path, entry, by_path)
            if path == "":
                if entry.type == EntryType.DIR:
                    if entry.opaque:
                        self._drop_children("")
                    self._map[""] = (index, entry)
                continue
            self._ensure_parents(index, path)
            if entry.type == EntryType.WHITEOUT:
                self._remove(path)
                continue
            below = self._map.get(path)
            merges = (
                entry.type == EntryType.DIR
                and not entry.opaque
                and below is not None
                and below[1].type == EntryType.DIR
            )
            if not merges:
                self._remove(path)
            self._set(path, index, entry)

    @staticmethod
    def _hardlink_target(path: str, entry: TocEntry, by_path: dict[str, TocEntry]) -> TocEntry:
        seen = 0
        target = entry
        while target.type == EntryType.HARDLINK:
            seen += 1
            nxt = by_path.get(norm(target.link))
            if nxt is None or seen > len(by_path):
                raise FormatError(f"hardlink {path!r} -> {target.link!r}: target not in its layer")
            target = nxt
        if target.type in (EntryType.DIR, EntryType.WHITEOUT):
            raise FormatError(f"hardlink {path!r} -> {entry.link!r}: target is a {target.type.value}")
        return target

    def _ensure_parents(self, index: int, path: str) -> None:
        """A layer that names `a/b/c` without `a/b` still has `a/b` as a directory (as unpacked)."""
        parent = path.rpartition("/")[0]
        missing = []
        while parent and not self._has_dir(parent):
            missing.append(parent)
            parent = parent.rpartition("/")[0]
        for p in reversed(missing):
            self._remove(p)  # whatever non-directory a lower layer had there is hidden
            self._set(p, index, TocEntry(path=p, type=EntryType.DIR, mode=0o755))

    def _has_dir(self, path: str) -> bool:
        found = self._map.get(path)
        return found is not None and found[1].type == EntryType.DIR

    def _set(self, path: str, index: int, entry: TocEntry) -> None:
        self._map[path] = (index, entry)
        parent, _, name = path.rpartition("/")
        self._children.setdefault(parent, set()).add(name)
        if entry.type == EntryType.DIR:
            self._children.setdefault(path, set())
            if entry.opaque:
                self._drop_children(path)

    def _drop_children(self, path: str) -> None:
        for name in list(self._children.get(path, ())):
            self._remove(f"{path}/{name}" if path else name)

    def _remove(self, path: str) -> None:
        if path not in self._map:
            return
        self._drop_children(path)
        self._children.pop(path, None)
        del self._map[path]
        parent, _, name = path.rpartition("/")
        self._children.get(parent, set()).discard(name)

    # -- queries -----------------------------------------------------------------------------
    def lookup(self, path: str) -> tuple[int, TocEntry] | None:
        """(layer index, entry) at exactly `path` (no symlink following), or None.

        The root always exists; with no layer naming it, its layer index is -1."""
        return self._map.get(norm(path))

    def listdir(self, path: str = "") -> list[str]:
        """Sorted names in the directory `path`. FileNotFoundError / NotADirectoryError."""
        key = norm(path)
        found = self._map.get(key)
        if found is None:
            raise FileNotFoundError(errno.ENOENT, "no such file or directory", path)
        if found[1].type != EntryType.DIR:
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", path)
        names = self._sorted.get(key)
        if names is None:
            names = self._sorted[key] = sorted(self._children.get(key, ()))
        return list(names)

    def walk(self, path: str = "") -> Iterator[tuple[str, int, TocEntry]]:
        """(path, layer index, entry) for `path` and everything under it, parents first, sorted."""
        key = norm(path)
        found = self._map.get(key)
        if found is None:
            return
        yield key, found[0], found[1]
        if found[1].type == EntryType.DIR:
            for name in self.listdir(key):
                yield from self.walk(f"{key}/{name}" if key else name)

    def __len__(self) -> int:
        return len(self._map)

    def __contains__(self, path: str) -> bool:
        return norm(path) in self._map

    def entry_at(self, path: str) -> TocEntry | None:
        """The entry at `path` with `path` set to the looked-up path (hardlinks keep the target's
        bytes and attributes)."""
        found = self.lookup(path)
        if found is None:
            return None
        entry = found[1]
        key = norm(path)
        return entry if entry.path == key else replace(entry, path=key)

    def resolve(self, path: str, *, follow: bool = True) -> str:
        """The path with every symlink followed, as `open()` inside a chroot at the stack root.

        Intermediate components must exist and be directories (FileNotFoundError,
        NotADirectoryError); the last may be missing (it is returned as named). With
        follow=False a symlink in the last component is not followed. More than 40 links:
        OSError(ELOOP)."""
        todo = [p for p in path.split("/") if p not in ("", ".")]
        todo.reverse()  # a stack: pop() gives the next component
        done: list[str] = []
        links = 0
        while todo:
            name = todo.pop()
            if name == "..":
                if done:
                    done.pop()
                continue
            current = "/".join(done + [name])
            found = self._map.get(current)
            last = not todo
            if found is None:
                if last:
                    done.append(name)
                    continue
                raise FileNotFoundError(errno.ENOENT, "no such file or directory", current)
            entry = found[1]
            if entry.type == EntryType.SYMLINK and (follow or not last):
                links += 1
                if links > MAX_SYMLINKS:
                    raise OSError(errno.ELOOP, "too many levels of symbolic links", path)
                target = entry.link
                if target.startswith("/"):
                    done = []
                todo.extend(reversed([p for p in target.split("/") if p not in ("", ".")]))
                continue
            if not last and entry.type != EntryType.DIR:
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", current)
            done.append(name)
        return "/".join(done)
