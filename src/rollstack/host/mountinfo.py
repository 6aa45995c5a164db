"""/proc/self/mountinfo, parsed once and right.

The kernel writes a mount point or source with space, tab, newline and backslash as `\\ooo`
octal escapes and every other byte raw (a non-ASCII path is its UTF-8 bytes). So a field is
decoded as bytes: escapes become bytes, then the whole is decoded as UTF-8 (undecodable bytes
survive as surrogates, like `os.fsdecode`). `str.decode("unicode_escape")` would mangle every
non-ASCII path (it reads UTF-8 bytes as Latin-1).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
_ESCAPE = re.compile(rb"\\([0-7]{3})")
_SPECIAL = re.compile(rb"[ \t\n\\]")


@dataclass(frozen=True)
class Mount:
    """One line of mountinfo: where, what filesystem, from what source, with which options."""

    mount_point: str
    fstype: str
    source: str
    options: str
    """The mount options (field 6) followed by the superblock options, comma separated."""


def unescape(field: str) -> str:
    """A mountinfo field with its `\\ooo` escapes decoded (bytes, then UTF-8)."""
    raw = _ESCAPE.sub(lambda m: bytes([int(m.group(1), 8) & 0xFF]), field.encode("utf-8", "surrogateescape"))
    return raw.decode("utf-8", "surrogateescape")


def parse(text: str) -> list[Mount]:
    """Every well-formed line of a mountinfo text, in mount order (later mounts stack on top)."""
    out = []
    for line in text.split("\n"):  # not splitlines(): "\r", "\x85"... are raw bytes of a path
        fields = line.split(" ")
        if "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        if len(fields) < sep + 3:
            continue
        out.append(Mount(unescape(fields[4]), fields[sep + 1], unescape(fields[sep + 2]),
                         ",".join(x for x in (fields[5], fields[sep + 3] if len(fields) > sep + 3 else "") if x)))
    return out


def read(text: str | None = None) -> list[Mount]:
    """The mounts of this process's mount namespace (or of `text`, for tests)."""
    return parse(_text(text))


def _text(text: str | None) -> str:
    """`text`, or this process's mount table decoded as `parse` wants it."""
    return MOUNTINFO.read_bytes().decode("utf-8", "surrogateescape") if text is None else text


def of_types(fstypes: tuple[str, ...], text: str | None = None) -> list[Mount]:
    """The mounts whose filesystem type is one of `fstypes`, in mount order. Only their lines
    are parsed: the type is the field after the ` - ` separator, and a literal space in any
    field is written `\\040`, so ` - <type> ` occurs in exactly those lines."""
    marks = tuple(f" - {t} " for t in fstypes)
    return parse("\n".join(line for line in _text(text).split("\n") if any(m in line for m in marks)))


def mount_points(text: str | None = None) -> list[tuple[str, str]]:
    """(mount point, fs type) of every mount, in mount order."""
    return [(m.mount_point, m.fstype) for m in read(text)]


def mounted_at(path: Path | str, text: str | None = None) -> str | None:
    """The filesystem type mounted exactly at `path` (the top mount when several stack), or None."""
    want = os.path.realpath(path)
    found = None
    for m in read(text):
        if m.mount_point == want:
            found = m.fstype
    return found


def escape(path: str) -> bytes:
    """`path` as mountinfo writes it: its bytes with space, tab, newline and backslash as `\\ooo`."""
    return _SPECIAL.sub(lambda m: b"\\%03o" % m.group(0)[0], os.fsencode(path))


def is_mounted(path: Path | str, text: bytes | None = None) -> bool:
    """Whether something is mounted exactly at `path`.

    Without parsing the table: the escaped path is searched for with a space on each side, and
    only the lines it occurs in are split, to check it is their mount point field. On a node
    with 128 environments (~600 mounts whose overlay options list every lower) a full parse
    costs ~2.6 ms, and destroy asks about nine times, the files API once per call."""
    want = escape(os.path.realpath(path))
    if text is None:
        text = MOUNTINFO.read_bytes()
    needle = b" " + want + b" "
    i = text.find(needle)
    while i >= 0:
        start = text.rfind(b"\n", 0, i) + 1
        end = text.find(b"\n", i)
        fields = text[start:end if end >= 0 else len(text)].split(b" ", 5)
        if len(fields) > 4 and fields[4] == want:
            return True
        i = text.find(needle, i + 1)
    return False


def mounts_under(prefix: Path | str, text: str | None = None) -> list[str]:
    """Mount points strictly below the directory `prefix`, in mount order."""
    base = str(prefix).rstrip("/") + "/"
    return [m.mount_point for m in read(text) if m.mount_point.startswith(base)]


def devices(text: str | None = None) -> dict[str, tuple[int, int]]:
    """Mount point -> (major, minor) of the filesystem mounted there (the top one when several
    stack), from mountinfo's third field: known without touching the mount, which a hung FUSE
    mount would never answer (its connection is `/sys/fs/fuse/connections/<dev>`)."""
    out: dict[str, tuple[int, int]] = {}
    for line in _text(text).split("\n"):
        fields = line.split(" ", 5)
        if len(fields) < 5 or ":" not in fields[2]:
            continue
        major, _, minor = fields[2].partition(":")
        try:
            out[unescape(fields[4])] = (int(major), int(minor))
        except ValueError:
            continue
    return out
