"""Layer path rules: every TOC path is relative, normalised and '/'-separated ("" = root).

Pure. Anything that could address a file outside the layer (absolute paths, `..` components,
NUL bytes) is rejected with `UnsafePath`, naming the offending entry.
"""

from __future__ import annotations

from rollstack.errors import UnsafePath


def normalize(name: str, *, what: str = "entry") -> str:
    """`./a//b/` -> `a/b`; `.`/`./` -> `""`. Rejects absolute paths, `..` and NUL."""
    if "\0" in name:
        raise UnsafePath(f"{what} {name!r} contains a NUL byte")
    if name.startswith("/"):
        raise UnsafePath(f"{what} {name!r} is an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafePath(f"{what} {name!r} has a '..' component")
    return "/".join(parts)


def parent(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


def ancestors(path: str) -> list[str]:
    """Strict ancestors of `path`, nearest last, excluding the root: `a/b/c` -> [a, a/b]."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]
