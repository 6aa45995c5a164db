"""`ForkLayers`: the node's frozen uppers, the layers forked environments stack (`<root>/forks`).

`NodeService.fork(id, count)` freezes the parent for the instant of the cut (`runc pause`),
copies its upper into a new layer dir (rollstack.run.snapshot.copy_upper) and thaws it; the
children stack that one read-only copy on top of the parent's lowers, each under its own fresh
upper (never a copy per child). A parent forked from a fork passes its own frozen layers on
below the new one.

Where a layer lives: small changes in memory, `<root>/forks/mem`, a tmpfs of at most
`NodeConfig.fork_memory` bytes the node mounts at start (a copy of 1,000 small files into it
takes a fifth of the time it takes on the node's disk, and the copy is what the parent waits
for); a layer whose estimate (the upper's size, taken before the freeze) does not fit in what
is free there, or that meets a full tmpfs mid-copy, goes to `<root>/forks` on disk. Children
never see the difference. The tmpfs outlives an agent restart (adopted environments stack its
layers) and is unmounted by `stop()` once no layer is left in it; `rollstack node doctor`
reclaims it like any mount below a node root.

One owner: a layer lives while an environment of this node stacks it. `collect(in_use)` removes
every layer no live environment names (after each teardown of a forked environment, and at
start against the environments recovery adopted); a layer being made or handed to children not
yet built is `pending` and never collected. A crash mid-copy leaves `<id>.tmp`, removed the same
way.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable

from rollstack.errors import DiskFull
from rollstack.host import libc
from rollstack.host.mountinfo import is_mounted
from rollstack.host.tree import remove_tree
from rollstack.run.snapshot import copy_upper, tree_size

log = logging.getLogger(__name__)

MEM_DIR = "mem"
"""The tmpfs below the fork root that holds the layers small enough for memory."""
_PAGE = 4096


def layer_names(forks: Path) -> list[str]:
    """The layers under a node's `forks` dir, on disk (`<name>`) and in its tmpfs (`mem/<name>`)."""
    if not forks.is_dir():
        return []
    mem = forks / MEM_DIR
    names = sorted(p.name for p in forks.iterdir() if p != mem)
    return names + (sorted(f"{MEM_DIR}/{p.name}" for p in mem.iterdir()) if mem.is_dir() else [])


class ForkLayers:
    def __init__(self, root: Path, memory: int = 0) -> None:
        self.root = Path(root)
        self.mem = self.root / MEM_DIR
        self.memory = memory
        """Bytes of the tmpfs (0: every layer on disk)."""
        self._lock = threading.Lock()
        self._pending: set[Path] = set()
        self.made = 0
        self.removed = 0
        self.in_memory = 0
        self._mounted = False
        """Whether the tmpfs is ours to use (set by start/stop: no mount table read per fork)."""
        self.headroom: Callable[[], int] | None = None
        """Node memory no environment has committed (the provisioner's `free_memory`, set by the
        node): a layer goes to memory only if it fits there too, so the tmpfs never takes what
        admission promised an environment."""

    def start(self) -> None:
        """Mount the tmpfs (kept when a previous agent's is there: adopted children stack its
        layers). A kernel that refuses leaves every layer on disk, with a warning."""
        self.root.mkdir(parents=True, exist_ok=True)
        if self.memory <= 0:
            return
        if is_mounted(self.mem):
            self._mounted = True
            return
        self.mem.mkdir(exist_ok=True)
        err = libc.mount(b"tmpfs", self.mem, b"tmpfs", libc.MS_NOSUID | libc.MS_NODEV, f"size={self.memory},mode=0700".encode())
        if err:
            log.warning("fork layers stay on disk: mounting a tmpfs at %s failed: %s", self.mem, os.strerror(err))
            self.mem.rmdir()
            return
        self._mounted = True

    def stop(self) -> None:
        """Unmount the tmpfs if no layer is in it or being made (else it stays mounted for the
        next agent, whose start adopts it). Never a lazy detach: a busy tmpfs stays visible."""
        with self._lock:
            if not is_mounted(self.mem):
                return
            if any(self.mem.iterdir()) or any(p.parent == self.mem for p in self._pending):
                log.warning("fork layers are left in %s: its tmpfs stays mounted", self.mem)
                return
            self._mounted = False
            err = libc.umount2(self.mem)
            if err:
                log.warning("the fork layers' tmpfs at %s stays mounted: %s", self.mem, os.strerror(err))
                return
        try:
            self.mem.rmdir()
        except OSError:
            pass

    def _where(self, estimate: dict[str, int]) -> Path:
        """The dir a layer of about `estimate` goes to: memory while it fits in what is free there
        (with each file rounded up to a page, and a quarter kept free), else disk."""
        if self.memory > 0 and self._mounted:
            need = estimate["bytes"] + (estimate["files"] + 1) * _PAGE
            st = os.statvfs(self.mem)
            if need <= st.f_bavail * st.f_frsize * 3 // 4 and (self.headroom is None or need <= self.headroom()):
                return self.mem
        return self.root

    def memory_used(self) -> int:
        """Bytes of node memory the tmpfs holds now (0 when it is not mounted): counted by the
        provisioner as committed, like an environment's quota."""
        if not self._mounted:
            return 0
        try:
            st = os.statvfs(self.mem)
        except OSError:
            return 0
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def freeze(self, env: Any) -> tuple[Path, dict[str, float]]:
        """A frozen copy of `env`'s upper (the environment paused for the copy), marked pending
        until `settle`; with {"files", "bytes", "pause_s", "copy_s", "in_memory" (1.0 or 0.0)}.
        "files" and "bytes" are the upper's just before the freeze (one walk, outside it: the
        tmpfs or disk choice needs it), or the copy's when it grew past the tmpfs meanwhile."""
        self.root.mkdir(parents=True, exist_ok=True)
        name = f"f{uuid.uuid4().hex[:12]}"
        size = tree_size(env.upper)  # before the freeze: the parent does not wait on it
        where = self._where(size)
        layer = where / name
        with self._lock:
            self._pending.add(layer)
        try:
            t0 = time.perf_counter()
            with env.cut():
                t1 = time.perf_counter()
                try:
                    copy_upper(env.upper, layer)
                except DiskFull:
                    if where == self.root:
                        raise
                    self._repend(layer, self.root / name)  # the tmpfs filled meanwhile: disk
                    layer = self.root / name
                    copy_upper(env.upper, layer)
                    size = {}
                t2 = time.perf_counter()
            t3 = time.perf_counter()
        except BaseException:
            self.settle(layer)
            remove_tree(layer)
            raise
        with self._lock:
            self.made += 1
            self.in_memory += layer.parent == self.mem
        size = size or tree_size(layer)
        return layer, {**{k: float(v) for k, v in size.items()}, "copy_s": round(t2 - t1, 6),
                       "pause_s": round(t3 - t0, 6), "in_memory": float(layer.parent == self.mem)}

    def _repend(self, old: Path, new: Path) -> None:
        with self._lock:
            self._pending.discard(old)
            self._pending.add(new)

    def settle(self, layer: Path) -> None:
        """The children of `layer` are built (or failed): it lives by their reference now."""
        with self._lock:
            self._pending.discard(layer)

    def _dirs(self) -> list[Path]:
        return [d for d in (self.root, self.mem) if d.is_dir()]

    def collect(self, in_use: Iterable[Path]) -> list[Path]:
        """Remove the layers no environment in `in_use` (their fork layers) stacks; the removed."""
        keep = {Path(p) for p in in_use}
        gone = []
        with self._lock:
            keep |= self._pending
            for d in self._dirs():
                for child in d.iterdir():
                    base = child.with_name(child.name.removesuffix(".tmp"))
                    if child == self.mem or child in keep or (child.name.endswith(".tmp") and base in self._pending):
                        continue
                    remove_tree(child)
                    gone.append(child)
            self.removed += len(gone)
        if gone:
            log.info("removed %d fork layer(s) no environment stacks", len(gone))
        return gone

    def stats(self) -> dict[str, float]:
        layers = [p for d in self._dirs() for p in d.iterdir() if p != self.mem and not p.name.endswith(".tmp")]
        return {"layers": float(len(layers)), "made": float(self.made), "removed": float(self.removed),
                "made_in_memory": float(self.in_memory), "memory_used_bytes": float(self.memory_used())}
