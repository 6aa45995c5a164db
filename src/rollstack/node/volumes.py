"""The node's volumes: named directories that outlive environments (docs/node.md#volumes).

Layout: `<root>/volumes/<name>/data/` is what environments mount, `<name>/volume.json` its
creation time. A create claims `<name>` with one `mkdir` (two creates of one name: one wins, the
other gets `already_exists`); a delete renames the directory out of the namespace first
(`.deleting-<name>-<nonce>`), so a create of the same name right after starts empty, then removes
it; leftovers of a crashed delete go at the next start. Whether a volume is in use is not kept
here: the node service derives it from its live environments' plans (one owner of that fact).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from rollstack.contract.files import split_request
from rollstack.errors import AlreadyExists, InvalidRequest, VolumeNotFound
from rollstack.host import atomic
from rollstack.plan.volumes import VolumeMount, check_name

log = logging.getLogger(__name__)
_DELETING = ".deleting-"


@dataclass(frozen=True)
class Volume:
    name: str
    created: float
    """Unix time of its create."""


class Volumes:
    """The volumes under one node root."""

    def __init__(self, root: Path) -> None:
        self.dir = Path(root) / "volumes"

    def start(self) -> None:
        """Make the directory; finish deletes a crash interrupted."""
        self.dir.mkdir(parents=True, exist_ok=True)
        for p in self.dir.iterdir():
            if p.name.startswith(_DELETING):
                shutil.rmtree(p, ignore_errors=True)

    def create(self, name: str) -> Volume:
        """A new, empty volume; AlreadyExists if `name` is taken."""
        check_name(name)
        home = self.dir / name
        try:
            home.mkdir(parents=True)
        except FileExistsError:
            raise AlreadyExists(f"volume {name!r} already exists") from None
        except OSError as exc:
            raise InvalidRequest(f"cannot create volume {name!r}: {exc.strerror or exc}") from None
        created = time.time()
        try:
            (home / "data").mkdir(mode=0o755)
            atomic.replace(home / "volume.json", json.dumps({"name": name, "created": created}).encode())
        except OSError as exc:
            shutil.rmtree(home, ignore_errors=True)
            raise InvalidRequest(f"cannot create volume {name!r}: {exc.strerror or exc}") from None
        return Volume(name, created)

    def get(self, name: str) -> Volume:
        """The volume `name`; VolumeNotFound if there is none (or the name is not a volume name)."""
        try:
            check_name(name)
        except InvalidRequest:
            raise VolumeNotFound(f"no volume {name!r}") from None
        home = self.dir / name
        if not (home / "data").is_dir():
            raise VolumeNotFound(f"no volume {name!r}")
        try:
            created = float(json.loads((home / "volume.json").read_bytes())["created"])
        except FileNotFoundError:
            created = (home / "data").stat().st_mtime  # its create was cut before the record
        except (OSError, ValueError, KeyError, TypeError):
            created = 0.0
        return Volume(name, created)

    def list(self) -> list[Volume]:
        out = []
        for p in sorted(self.dir.iterdir()) if self.dir.is_dir() else []:
            if p.name.startswith(_DELETING):
                continue
            try:
                out.append(self.get(p.name))
            except VolumeNotFound:
                continue
        return out

    def data(self, name: str) -> Path:
        """The host directory environments mount (it exists: `get` first)."""
        self.get(name)
        return self.dir / name / "data"

    def detach(self, name: str) -> Path:
        """Take volume `name` out of the namespace at once (a rename; the caller checked nobody
        mounts it); `remove` deletes what it returns, at leisure."""
        self.get(name)
        grave = self.dir / f"{_DELETING}{name}-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(self.dir / name, grave)
        except FileNotFoundError:
            raise VolumeNotFound(f"no volume {name!r}") from None
        return grave

    @staticmethod
    def remove(grave: Path) -> None:
        shutil.rmtree(grave, ignore_errors=True)
        if grave.exists():
            log.warning("%s could not be removed entirely (the next start retries)", grave)


def route_path(mounts: Sequence[VolumeMount], path: str) -> tuple[VolumeMount | None, str]:
    """Which volume an environment path is in: (its mount, the path inside the volume), or
    (None, path) for the environment's own tree. The files API follows the mounts the
    environment's processes see (a bind mount is not in the host's view of its root)."""
    parts = split_request(path)
    for m in mounts:
        mp = [p for p in m.path.split("/") if p]
        if parts[:len(mp)] == mp:
            return m, "/" + "/".join(parts[len(mp):])
    return None, path
