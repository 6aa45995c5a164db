"""An environment's changes as a git-style unified diff: the overlay upper against the stack.

`upper_diff(upper, lower)` walks the upper dir with overlayfs' semantics (whiteouts = deleted,
`trusted.overlay.opaque` dirs hide the stack below them) and compares each changed path with
`lower` (a `LowerReader`, normally `LowerView(lowers)`). The output is what `git diff` would
print and applies with `git apply` (or `patch -p1`) onto the original tree:
- text files: `diff --git a/P b/P`, `new file mode` / `deleted file mode` / `old mode`+`new mode`
  headers, hunks with 3 lines of context, `\\ No newline at end of file` where due;
- symlinks: mode 120000, the target as content (as git stores them);
- binary files (a NUL in the first 8000 bytes, or not UTF-8): named only,
  `Binary files a/P and b/P differ` (git apply refuses a patch with such a section), or with
  `binary="patch"` a `GIT binary patch` (full `index` hashes, literal hunks) git apply applies;
- files whose bytes and git mode (644/755/symlink) did not change (e.g. copied up by chmod or
  touch) are left out; directories appear only through the files in them; devices, fifos and
  sockets are skipped.

Paths are relative to `base` (default "/"): only changes under it are reported. `excludes` drops
noise (DEFAULT_EXCLUDES): an entry starting with "/" excludes that absolute path and everything
under it; any other entry is an fnmatch pattern matched against every path component.
"""

from __future__ import annotations

import base64
import difflib
import fnmatch
import hashlib
import os
import zlib
import stat as statmod
from pathlib import Path
from typing import Sequence

from rollstack.errors import InvalidRequest
from rollstack.run.lowerview import Entry, LowerReader, LowerView, is_opaque, is_whiteout, kind_of

DEFAULT_EXCLUDES: tuple[str, ...] = (
    "/tmp", "/var/tmp", "/run", "/proc", "/sys", "/dev", "/.rollstack",
    "/root/.cache", "/var/cache", "/var/log",
    "__pycache__", "*.pyc", "*.pyo", ".pytest_cache", ".git",
)
CONTEXT_LINES = 3
_BINARY_SNIFF = 8000

__all__ = ["DEFAULT_EXCLUDES", "LowerView", "upper_diff", "format_file_diff", "is_excluded"]


def is_excluded(abs_path: str, excludes: Sequence[str]) -> bool:
    """Whether `abs_path` (starting with "/") falls under one of `excludes`."""
    parts = [p for p in abs_path.split("/") if p]
    for pat in excludes:
        if pat.startswith("/"):
            pat = pat.rstrip("/") or "/"
            if pat == "/" or abs_path == pat or abs_path.startswith(pat + "/"):
                return True
        elif any(fnmatch.fnmatchcase(p, pat) for p in parts):
            return True
    return False


def _git_mode(e: Entry) -> str:
    if e.kind == "symlink":
        return "120000"
    return "100755" if e.mode & statmod.S_IXUSR else "100644"


def _quote(name: str) -> str:
    """git's C-style quoting of a path when it has special bytes (else unchanged)."""
    raw = name.encode("utf-8", "surrogateescape")
    if not any(b < 0x20 or b >= 0x7f or b in (0x22, 0x5c) for b in raw):
        return name
    esc = {0x07: "\\a", 0x08: "\\b", 0x09: "\\t", 0x0a: "\\n", 0x0b: "\\v", 0x0c: "\\f",
           0x0d: "\\r", 0x22: '\\"', 0x5c: "\\\\"}
    out = []
    for b in raw:
        if b in esc:
            out.append(esc[b])
        elif b < 0x20 or b >= 0x7f:
            out.append(f"\\{b:03o}")
        else:
            out.append(chr(b))
    return '"' + "".join(out) + '"'


def _text(data: bytes) -> str | None:
    if b"\x00" in data[:_BINARY_SNIFF]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _lines(text: str) -> list[str]:
    # Only "\n" ends a line for diff/patch (str.splitlines would also split on \r, \f, ...).
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _range(start: int, stop: int) -> str:
    length = stop - start
    if length == 1:
        return str(start + 1)
    return f"{start if length == 0 else start + 1},{length}"


def _hunks(a: list[str], b: list[str]) -> list[str]:
    out: list[str] = []

    def line(prefix: str, s: str) -> None:
        out.append(prefix + s if s.endswith("\n") else prefix + s + "\n\\ No newline at end of file\n")

    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for group in matcher.get_grouped_opcodes(CONTEXT_LINES):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        out.append(f"@@ -{_range(i1, i2)} +{_range(j1, j2)} @@\n")
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                for s in a[a1:a2]:
                    line(" ", s)
                continue
            for s in a[a1:a2]:
                line("-", s)
            for s in b[b1:b2]:
                line("+", s)
    return out


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _binary_literal(data: bytes) -> str:
    """git's `literal` binary hunk: zlib-deflated, base85 in lines of <= 52 bytes."""
    packed = zlib.compress(data, 9)
    out = [f"literal {len(data)}\n"]
    for i in range(0, len(packed), 52):
        chunk = packed[i:i + 52]
        n = len(chunk)
        out.append((chr(ord("A") + n - 1) if n <= 26 else chr(ord("a") + n - 27)) +
                   base64.b85encode(chunk, pad=True).decode() + "\n")
    return "".join(out) + "\n"


def format_file_diff(path: str, old: Entry | None, new: Entry | None,
                     binary: str = "name") -> str:
    """One file's `diff --git` section ("" when nothing git tracks changed).

    `binary`: "name" (only say the files differ) or "patch" (a `GIT binary patch` that git
    apply can apply).
    """
    if binary not in ("name", "patch"):
        raise InvalidRequest(f"binary must be 'name' or 'patch', not {binary!r}")
    if old is None and new is None:
        return ""
    if old is not None and new is not None and old.kind != new.kind:
        # git shows a type change (file <-> symlink) as a deletion plus a creation.
        return format_file_diff(path, old, None, binary) + format_file_diff(path, None, new,
                                                                              binary)
    old_data = old.read() if old is not None else b""
    new_data = new.read() if new is not None else b""
    old_mode = _git_mode(old) if old is not None else None
    new_mode = _git_mode(new) if new is not None else None
    if old is not None and new is not None and old_data == new_data and old_mode == new_mode:
        return ""
    a_name, b_name = _quote("a/" + path), _quote("b/" + path)
    head = [f"diff --git {a_name} {b_name}\n"]
    if old is None:
        head.append(f"new file mode {new_mode}\n")
    elif new is None:
        head.append(f"deleted file mode {old_mode}\n")
    elif old_mode != new_mode:
        head += [f"old mode {old_mode}\n", f"new mode {new_mode}\n"]
    if old_data == new_data:  # mode-only change, or an empty file created/deleted
        return "".join(head)
    old_text, new_text = _text(old_data), _text(new_data)
    src = a_name if old is not None else "/dev/null"
    dst = b_name if new is not None else "/dev/null"
    if old_text is None or new_text is None:
        if binary == "patch":
            zero = "0" * 40
            ids = (f"index {_git_blob_id(old_data) if old is not None else zero}.."
                   f"{_git_blob_id(new_data) if new is not None else zero}")
            if old is not None and new is not None and old_mode == new_mode:
                ids += f" {old_mode}"
            return "".join(head) + ids + "\nGIT binary patch\n" + _binary_literal(new_data) \
                + _binary_literal(old_data)
        return "".join(head) + f"Binary files {src} and {dst} differ\n"
    tab = "\t" if " " in path else ""  # as git does, so patch(1) finds the name's end
    head += [f"--- {src}{tab if old is not None else ''}\n",
             f"+++ {dst}{tab if new is not None else ''}\n"]
    return "".join(head + _hunks(_lines(old_text), _lines(new_text)))


class _Collector:
    """Walks an upper dir and records (path -> old entry, new entry) for every changed file."""

    def __init__(self, upper: Path, lower: LowerReader, prefix: str = "",
                 excludes: Sequence[str] = ()) -> None:
        self.upper, self.lower = upper, lower
        self.prefix, self.excludes = prefix, excludes
        self.changes: dict[str, tuple[Entry | None, Entry | None]] = {}

    def wanted(self, rel: str) -> bool:
        """Whether `rel` is (or leads to) a reported path: prune the walk early, so excluded
        trees (caches, site-packages under /tmp, ...) cost nothing."""
        if is_excluded("/" + rel, self.excludes):
            return False
        return not self.prefix or rel.startswith(self.prefix) or self.prefix.startswith(rel + "/")

    def _deleted_subtree(self, rel: str) -> None:
        if not self.wanted(rel):
            return
        old = self.lower.entry(rel)
        if old is None:
            return
        if old.kind != "dir":
            self.changes[rel] = (old, None)
            return
        for name in self.lower.listdir(rel):
            self._deleted_subtree(f"{rel}/{name}" if rel else name)

    def visit(self, rel: str, opaque: bool) -> None:
        host = self.upper / rel if rel else self.upper
        names = sorted(os.listdir(host))
        if opaque:  # the stack below is hidden here: whatever it had and upper lacks is gone
            present = set(names)
            for name in self.lower.listdir(rel):
                if name not in present:
                    self._deleted_subtree(f"{rel}/{name}" if rel else name)
        for name in names:
            child = f"{rel}/{name}" if rel else name
            if not self.wanted(child):
                continue
            path = host / name
            st = os.lstat(path)
            if is_whiteout(st):
                self._deleted_subtree(child)
                continue
            old = self.lower.entry(child)
            kind = kind_of(st.st_mode)
            if kind == "dir":
                if old is not None and old.kind != "dir":
                    self.changes[child] = (old, None)
                self.visit(child, opaque or is_opaque(path) or
                           (old is not None and old.kind != "dir"))
            elif kind in ("file", "symlink"):
                if old is not None and old.kind == "dir":
                    self._deleted_subtree(child)
                    old = None
                elif old is not None and old.kind == "other":
                    old = None
                self.changes[child] = (old, Entry(kind, statmod.S_IMODE(st.st_mode), path))


def upper_diff(upper: Path, lower: LowerReader, *, base: str = "/",
               excludes: Sequence[str] = DEFAULT_EXCLUDES, binary: str = "name") -> str:
    """The unified diff of `upper` over `lower`, paths relative to `base` (absolute).

    `binary="patch"` carries binary files as git binary patches instead of naming them.
    """
    if not base.startswith("/") or ".." in base.split("/"):
        raise InvalidRequest(f"diff base must be an absolute path without '..': {base!r}")
    base = "/" + base.strip("/") if base.strip("/") else "/"
    prefix = "" if base == "/" else base.lstrip("/") + "/"
    collector = _Collector(Path(upper), lower, prefix, excludes)
    collector.visit("", False)
    out = []
    for rel in sorted(collector.changes):
        if prefix and not rel.startswith(prefix):
            continue
        if is_excluded("/" + rel, excludes):
            continue
        old, new = collector.changes[rel]
        out.append(format_file_diff(rel[len(prefix):], old, new, binary))
    return "".join(out)
