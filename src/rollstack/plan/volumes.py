"""Volumes in a plan: named directories of the node that outlive environments (datasets mounted
read-only, workspaces read-write), mounted at a path inside the environment. Pure validation;
the node's `rollstack.node.volumes` keeps them."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, field_validator

from rollstack.errors import InvalidRequest

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
"""A volume's name: one path component, never `.`/`..`, no slash (it names a directory)."""
MAX_MOUNTS = 16
RESERVED = ("/proc", "/sys", "/dev", "/.rollstack")
"""Mount points a volume may not cover (the runtime's own mounts and the exec agent)."""


def check_name(name: object) -> str:
    """`name` if it is a valid volume name, else InvalidRequest naming the rule."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise InvalidRequest(f"invalid volume name {name!r}: 1-63 of A-Z a-z 0-9 _ . -, starting with a "
                             "letter or digit")
    return name


def _check_mount_path(path: str) -> str:
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise ValueError(f"{path!r} must be an absolute path")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"'..' is not allowed in a mount path: {path!r}")
    if not parts:
        raise ValueError("a volume cannot be mounted at /")
    norm = "/" + "/".join(parts)
    if any(norm == r or norm.startswith(r + "/") for r in RESERVED):
        raise ValueError(f"a volume cannot be mounted at {norm} (under {', '.join(RESERVED)})")
    return norm


class VolumeMount(BaseModel):
    """`{name, path, read_only, exclusive}`: volume `name` at `path` inside the environment.
    Volumes are shared: every environment mounting one sees the others' writes at once (as a
    Docker named volume or an E2B volume). `exclusive` makes this environment its only user:
    its create fails with `volume_busy` while another environment mounts it, and so do other
    environments' creates while this one lives."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    name: str
    path: str
    read_only: bool = False
    exclusive: bool = False

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        try:
            return check_name(v)
        except InvalidRequest as exc:
            raise ValueError(exc.message) from None

    _path = field_validator("path")(classmethod(lambda cls, v: _check_mount_path(v)))


def check_mounts(mounts: list[VolumeMount]) -> list[VolumeMount]:
    """At most MAX_MOUNTS, each volume once, no mount point inside another."""
    if len(mounts) > MAX_MOUNTS:
        raise ValueError(f"at most {MAX_MOUNTS} volumes, not {len(mounts)}")
    names = [m.name for m in mounts]
    if len(set(names)) != len(names):
        raise ValueError("each volume can be mounted once per environment")
    paths = sorted(m.path for m in mounts)
    for a, b in zip(paths, paths[1:]):
        if b == a or b.startswith(a + "/"):
            raise ValueError(f"volume mount points overlap: {a} and {b}")
    return mounts
