"""Files in an environment, as the contract names them: request paths (`split_request`, the one
check every file API applies before touching anything) and directory entries (`Entry`, what the
node's directory operations answer: rollstack.run.fsops.TreeRoot)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from rollstack.errors import InvalidRequest, UnsafePath

NAME_MAX = 255
"""Bytes in one path component (Linux; ENAMETOOLONG beyond)."""
PATH_MAX = 4096


def split_request(path: str) -> list[str]:
    """The components of a request path; refuses `..`, NUL, names no Linux file can have (over
    NAME_MAX bytes, not encodable: a lone surrogate from a JSON escape) and paths over PATH_MAX,
    which the kernel would otherwise refuse with an OSError deep inside an operation."""
    if not isinstance(path, str) or "\x00" in path:
        raise UnsafePath(f"invalid path {path!r}")
    try:
        size = len(os.fsencode(path))
    except UnicodeError:
        raise UnsafePath(f"invalid path {path!r}: not valid UTF-8") from None
    if size > PATH_MAX:
        raise InvalidRequest(f"path of {size} bytes is longer than {PATH_MAX}")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafePath(f"'..' is not allowed in paths: {path!r}")
    for part in parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise InvalidRequest(f"file name of {len(os.fsencode(part))} bytes is longer than {NAME_MAX}: {part[:40]!r}...")
    return parts


def normalized(path: str) -> str:
    """The request path as an absolute, normalised one (`split_request`'s checks applied)."""
    return "/" + "/".join(split_request(path))


@dataclass(frozen=True)
class Entry:
    name: str
    path: str  # absolute inside the environment, normalised
    kind: str  # file | dir | symlink | other
    size: int
    mode: int  # st_mode (type and permission bits)
    uid: int
    gid: int
    mtime: float
    target: str | None = None  # a symlink's target
