"""Parsing git-style unified diffs into `FilePatch` values. Pure: bytes in, dataclasses out.

Understands what `git diff` / `git format-patch` write: `diff --git` headers with mode changes,
new/deleted files, renames and copies, `index` lines, text hunks with `\\ No newline at end of
file`, and `GIT binary patch` (literal and delta) payloads; plus plain `--- / +++` diffs. Paths
are stripped of one leading component (`a/`, `b/`), as `git apply` (-p1) does, and C-quoted
paths are unquoted. Text outside patches (commit messages, signatures) is ignored.
"""

from __future__ import annotations

import base64
import re
import zlib
from dataclasses import dataclass, field

from rollstack.errors import MutationFailed

_HUNK_RE = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


@dataclass(slots=True)
class Hunk:
    number: int  # 1-based, within its file (for error messages)
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    header: str  # the `@@ ... @@` line
    lines: list[tuple[str, bytes]] = field(default_factory=list)  # (' '|'-'|'+', line incl. '\n')

    @property
    def preimage(self) -> list[bytes]:
        return [text for op, text in self.lines if op != "+"]

    @property
    def postimage(self) -> list[bytes]:
        return [text for op, text in self.lines if op != "-"]


@dataclass(slots=True)
class BinaryPatch:
    method: str  # "literal" (the whole new content) or "delta" (a git delta against the old)
    size: int  # size of the decompressed payload
    data: bytes  # decompressed payload


@dataclass(slots=True)
class FilePatch:
    old_path: str | None = None  # None: the file is created
    new_path: str | None = None  # None: the file is deleted
    old_mode: int | None = None
    new_mode: int | None = None
    rename: bool = False
    copy: bool = False
    old_oid: str | None = None  # from the `index` line (abbreviated git blob ids)
    new_oid: str | None = None
    hunks: list[Hunk] = field(default_factory=list)
    binary: BinaryPatch | None = None
    binary_without_data: bool = False  # "Binary files a/x and b/x differ": cannot be applied
    git: bool = False

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or "?"

    @property
    def is_new(self) -> bool:
        return self.old_path is None

    @property
    def is_delete(self) -> bool:
        return self.new_path is None


def _unquote(text: str) -> str:
    """git's C-style quoted path (`"a/t\\303\\251st"`) -> the path; unquoted text unchanged."""
    if not (len(text) >= 2 and text[0] == '"' and text[-1] == '"'):
        return text
    raw = text[1:-1].encode("utf-8", "surrogateescape")
    out = bytearray()
    i = 0
    while i < len(raw):
        c = raw[i]
        if c == 0x5C and i + 1 < len(raw):
            nxt = chr(raw[i + 1])
            if nxt in "01234567":
                out.append(int(raw[i + 1 : i + 4], 8))
                i += 4
                continue
            out.append(_ESCAPES.get(nxt, raw[i + 1]))
            i += 2
            continue
        out.append(c)
        i += 1
    return out.decode("utf-8", "surrogateescape")


def _strip(path: str, *, strip_prefix: bool = True) -> str | None:
    if path == "/dev/null":
        return None
    path = _unquote(path)
    if strip_prefix:
        if "/" not in path:
            raise MutationFailed(f"patch path {path!r} has no leading component to strip (-p1)")
        path = path.split("/", 1)[1]
    return path


def _header_path(rest: str) -> str | None:
    """The path from a `--- X` / `+++ X` line (plain diffs may append a tab and a timestamp)."""
    if rest.startswith('"'):
        end = rest.find('"', 1)
        while end > 0 and rest[end - 1] == "\\":
            end = rest.find('"', end + 1)
        return _strip(rest[: end + 1])
    return _strip(rest.split("\t", 1)[0].rstrip("\r"))


def _git_line_paths(rest: str) -> tuple[str | None, str | None]:
    """Both names from `diff --git a/X b/Y`, for patches without ---/+++ (mode-only, empty files)."""
    if rest.startswith('"'):
        end = rest.index('" ', 1)
        first, second = rest[: end + 1], rest[end + 2 :]
        return _strip(first), _strip(second)
    # unquoted names may contain spaces: the common case is "a/X b/X" with the same X
    half = (len(rest) - 1) // 2
    if len(rest) % 2 == 1 and rest[half] == " " and rest[2:half] == rest[half + 3 :]:
        return _strip(rest[:half]), _strip(rest[half + 1 :])
    if " b/" in rest:
        first, second = rest.split(" b/", 1)
        return _strip(first), second
    raise MutationFailed(f"cannot parse file names in 'diff --git {rest}'")


def _decode_base85_line(line: bytes, lineno: int) -> bytes:
    c = line[:1]
    if b"A" <= c <= b"Z":
        n = c[0] - ord("A") + 1
    elif b"a" <= c <= b"z":
        n = c[0] - ord("a") + 27
    else:
        raise MutationFailed(f"corrupt binary patch at line {lineno}")
    try:
        return base64.b85decode(line[1:])[:n]
    except ValueError:
        raise MutationFailed(f"corrupt binary patch at line {lineno}") from None


class _Parser:
    def __init__(self, data: bytes) -> None:
        self.lines = data.split(b"\n")
        if self.lines and self.lines[-1] == b"":
            self.lines.pop()
        self.i = 0
        self.patches: list[FilePatch] = []

    def parse(self) -> list[FilePatch]:
        current: FilePatch | None = None
        while self.i < len(self.lines):
            raw = self.lines[self.i]
            line = raw.decode("utf-8", "surrogateescape")
            if line.startswith("diff --git "):
                current = FilePatch(git=True)
                current.old_path, current.new_path = _git_line_paths(line[len("diff --git "):].rstrip("\r"))
                self.patches.append(current)
                self.i += 1
                self._git_header(current)
                continue
            if line.startswith("--- ") and self.i + 1 < len(self.lines) and self.lines[self.i + 1].startswith(b"+++ "):
                if current is None or current.hunks or current.git:
                    current = FilePatch()
                    self.patches.append(current)
                self._file_names(current)
                continue
            if line.startswith("@@ ") and current is not None and not current.git:
                self._hunk(current)
                continue
            self.i += 1
        return self.patches

    def _file_names(self, patch: FilePatch) -> None:
        old = self.lines[self.i].decode("utf-8", "surrogateescape")[4:]
        new = self.lines[self.i + 1].decode("utf-8", "surrogateescape")[4:]
        self.i += 2
        old_path, new_path = _header_path(old), _header_path(new)
        if not patch.rename and not patch.copy:
            patch.old_path = old_path
            patch.new_path = new_path
        if patch.old_path is None and patch.new_path is None:
            raise MutationFailed(f"patch at line {self.i - 1} names /dev/null on both sides")

    def _git_header(self, patch: FilePatch) -> None:
        while self.i < len(self.lines):
            line = self.lines[self.i].decode("utf-8", "surrogateescape").rstrip("\r")
            if line.startswith("old mode "):
                patch.old_mode = int(line[9:], 8)
            elif line.startswith("new mode "):
                patch.new_mode = int(line[9:], 8)
            elif line.startswith("deleted file mode "):
                patch.old_mode = int(line[18:], 8)
                patch.new_path = None
            elif line.startswith("new file mode "):
                patch.new_mode = int(line[14:], 8)
                patch.old_path = None
            elif line.startswith(("rename from ", "copy from ")):
                patch.rename = line.startswith("rename")
                patch.copy = not patch.rename
                patch.old_path = _strip(line.split(" ", 2)[2], strip_prefix=False)
            elif line.startswith(("rename to ", "copy to ")):
                patch.new_path = _strip(line.split(" ", 2)[2], strip_prefix=False)
            elif line.startswith("index "):
                ids = line[6:].split(" ")[0]
                if ".." in ids:
                    patch.old_oid, patch.new_oid = ids.split("..", 1)
                if " " in line[6:]:
                    mode = int(line[6:].split(" ")[1], 8)
                    patch.old_mode = patch.old_mode or mode
                    patch.new_mode = patch.new_mode or mode
            elif line.startswith(("similarity index ", "dissimilarity index ")):
                pass
            elif line.startswith("--- "):
                self._file_names(patch)
                continue
            elif line.startswith("@@ "):
                self._hunk(patch)
                continue
            elif line.startswith("Binary files "):
                patch.binary_without_data = True
            elif line == "GIT binary patch":
                self.i += 1
                patch.binary = self._binary()
                continue
            else:
                return  # end of this file's patch
            self.i += 1

    def _hunk(self, patch: FilePatch) -> None:
        header = self.lines[self.i]
        m = _HUNK_RE.match(header)
        if not m:
            raise MutationFailed(f"{patch.path}: corrupt hunk header at line {self.i + 1}")
        old_count = int(m.group(2)) if m.group(2) is not None else 1
        new_count = int(m.group(4)) if m.group(4) is not None else 1
        hunk = Hunk(len(patch.hunks) + 1, int(m.group(1)), old_count, int(m.group(3)), new_count,
                    header.decode("utf-8", "replace").rstrip("\r"))
        self.i += 1
        old_left, new_left = old_count, new_count
        while old_left > 0 or new_left > 0:
            if self.i >= len(self.lines):
                raise MutationFailed(f"{patch.path}: hunk #{hunk.number} ({hunk.header}) is truncated")
            raw = self.lines[self.i]
            op = chr(raw[0]) if raw else " "  # an empty line is an empty context line
            if op == "\\":
                self._no_newline(hunk)
                continue
            if op not in " -+":
                raise MutationFailed(
                    f"{patch.path}: corrupt patch at line {self.i + 1} in hunk #{hunk.number} ({hunk.header})"
                )
            hunk.lines.append((op, raw[1:] + b"\n"))
            if op != "+":
                old_left -= 1
            if op != "-":
                new_left -= 1
            if old_left < 0 or new_left < 0:
                raise MutationFailed(f"{patch.path}: hunk #{hunk.number} ({hunk.header}) has more lines than its header says")
            self.i += 1
        if self.i < len(self.lines) and self.lines[self.i].startswith(b"\\"):
            self._no_newline(hunk)
        patch.hunks.append(hunk)

    def _no_newline(self, hunk: Hunk) -> None:
        if hunk.lines:
            op, text = hunk.lines[-1]
            hunk.lines[-1] = (op, text[:-1] if text.endswith(b"\n") else text)
        self.i += 1

    def _binary(self) -> BinaryPatch:
        head = self.lines[self.i].decode("ascii", "replace").split(" ")
        if len(head) != 2 or head[0] not in ("literal", "delta") or not head[1].isdigit():
            raise MutationFailed(f"corrupt binary patch at line {self.i + 1}")
        self.i += 1
        chunks = []
        while self.i < len(self.lines) and self.lines[self.i].strip():
            chunks.append(_decode_base85_line(self.lines[self.i].rstrip(b"\r"), self.i + 1))
            self.i += 1
        try:
            data = zlib.decompress(b"".join(chunks))
        except zlib.error:
            raise MutationFailed(f"corrupt binary patch before line {self.i + 1}") from None
        if len(data) != int(head[1]):
            raise MutationFailed(f"binary patch before line {self.i + 1}: size {len(data)} != {head[1]}")
        # skip the reverse patch git adds after a blank line
        while self.i < len(self.lines) and not self.lines[self.i].strip():
            self.i += 1
        if self.i < len(self.lines) and self.lines[self.i].startswith((b"literal ", b"delta ")):
            self.i += 1
            while self.i < len(self.lines) and self.lines[self.i].strip():
                self.i += 1
        return BinaryPatch(head[0], int(head[1]), data)


def parse_patch(diff: str | bytes) -> list[FilePatch]:
    """Every file patch in `diff`, in order. Raises MutationFailed on corrupt input."""
    data = diff.encode("utf-8", "surrogateescape") if isinstance(diff, str) else bytes(diff)
    parser = _Parser(data)
    try:
        return parser.parse()
    except (ValueError, IndexError) as exc:  # a malformed mode, quote, number...: one error type out
        raise MutationFailed(f"corrupt patch at line {parser.i + 1}: {exc}") from None
