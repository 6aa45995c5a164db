"""`ForkLayers`: the node's frozen uppers, the layers forked environments stack (`<root>/forks`).

`NodeService.fork(id, count)` freezes the parent for the instant of the cut (`runc pause`),
copies its upper into `<root>/forks/<fork-id>` (rollstack.run.snapshot.copy_upper) and thaws
it; the children stack that one read-only copy on top of the parent's lowers, each under its
own fresh upper (never a copy per child). A parent forked from a fork passes its own frozen
layers on below the new one.

One owner: a layer lives while an environment of this node stacks it. `collect(in_use)` removes
every layer no live environment names (after each teardown of a forked environment, and at
start against the environments recovery adopted); a layer being made or handed to children not
yet built is `pending` and never collected. A crash mid-copy leaves `<id>.tmp`, removed the same
way.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterable

from rollstack.run.snapshot import copy_upper

log = logging.getLogger(__name__)


class ForkLayers:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()
        self._pending: set[Path] = set()
        self.made = 0
        self.removed = 0

    def freeze(self, env: Any) -> tuple[Path, dict[str, float]]:
        """A frozen copy of `env`'s upper (the environment paused for the copy), marked pending
        until `settle`; with {"files", "bytes", "pause_s", "copy_s"}."""
        self.root.mkdir(parents=True, exist_ok=True)
        layer = self.root / f"f{uuid.uuid4().hex[:12]}"
        with self._lock:
            self._pending.add(layer)
        try:
            t0 = time.perf_counter()
            with env.cut():
                t1 = time.perf_counter()
                size = copy_upper(env.upper, layer)
                t2 = time.perf_counter()
        except BaseException:
            self.settle(layer)
            shutil.rmtree(layer, ignore_errors=True)
            raise
        self.made += 1
        return layer, {**{k: float(v) for k, v in size.items()}, "copy_s": round(t2 - t1, 6),
                       "pause_s": round(time.perf_counter() - t0, 6)}

    def settle(self, layer: Path) -> None:
        """The children of `layer` are built (or failed): it lives by their reference now."""
        with self._lock:
            self._pending.discard(layer)

    def collect(self, in_use: Iterable[Path]) -> list[Path]:
        """Remove the layers no environment in `in_use` (their fork layers) stacks; the removed."""
        if not self.root.is_dir():
            return []
        keep = {Path(p) for p in in_use}
        gone = []
        with self._lock:
            keep |= self._pending
            for child in self.root.iterdir():
                base = child.with_name(child.name.removesuffix(".tmp"))
                if child in keep or (child.name.endswith(".tmp") and base in self._pending):
                    continue
                shutil.rmtree(child, ignore_errors=True)
                gone.append(child)
        self.removed += len(gone)
        if gone:
            log.info("removed %d fork layer(s) no environment stacks", len(gone))
        return gone

    def stats(self) -> dict[str, float]:
        layers = [p for p in self.root.iterdir() if not p.name.endswith(".tmp")] if self.root.is_dir() else []
        return {"layers": float(len(layers)), "made": float(self.made), "removed": float(self.removed)}
