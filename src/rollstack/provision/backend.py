"""`CgroupBackend`: the one interface the provisioner talks to, and `detect_backend()`.

Paths are cgroup-relative (e.g. `rollstack/<env-id>`): each backend maps them onto its own
hierarchy layout (v1: one directory per controller; v2: one unified directory). Every method
works on cgroups rollstack owns; nothing here touches a cgroup it did not create or get handed.
"""

from __future__ import annotations

import abc
import os
import signal
import time
from pathlib import Path

from rollstack.errors import RuntimeFailure
from rollstack.provision.sample import CgroupSample

CFS_PERIOD_US = 100_000
"""CFS enforcement period rollstack writes (the kernel default, 100 ms)."""


class CgroupBackend(abc.ABC):
    """Create, limit, sample and remove cgroups under one cgroupfs root."""

    version: int
    root: Path

    @abc.abstractmethod
    def create(self, path: str) -> None:
        """Create the cgroup (idempotent) and prepare it for elastic control (v1: oom_kill_disable)."""

    @abc.abstractmethod
    def exists(self, path: str) -> bool:
        """True if the cgroup directory exists."""

    @abc.abstractmethod
    def procs(self, path: str) -> list[int]:
        """PIDs currently in the cgroup (any controller)."""

    @abc.abstractmethod
    def add_proc(self, path: str, pid: int) -> None:
        """Move `pid` (and, as the kernel does, not its existing children) into the cgroup."""

    @abc.abstractmethod
    def set_cpu(self, path: str, cores: float | None) -> None:
        """Limit CPU to `cores` (None = unlimited)."""

    @abc.abstractmethod
    def set_cpu_weight(self, path: str, weight: int) -> None:
        """Relative CPU share under contention, in v2 units (1..10000, default 100)."""

    @abc.abstractmethod
    def set_memory(self, path: str, limit_bytes: int, high: int | None = None) -> int:
        """Set the memory limit; returns the limit actually in force (may stay higher: see backends)."""

    @abc.abstractmethod
    def set_memory_quota(self, path: str, quota: int, cap: int) -> int:
        """Apply the elastic memory quota so that reaching it pauses/throttles, not kills; returns it."""

    @abc.abstractmethod
    def set_pids(self, path: str, max_pids: int | None) -> None:
        """Limit the number of tasks (None = unlimited)."""

    @abc.abstractmethod
    def sample(self, path: str) -> CgroupSample:
        """Read the cgroup's counters (cheap: cached file descriptors, one pread each)."""

    @abc.abstractmethod
    def oom_kills(self, path: str) -> int:
        """How many tasks the kernel OOM-killed in this cgroup, read now."""

    @abc.abstractmethod
    def forget(self, path: str) -> None:
        """Drop cached file descriptors for `path` (after it is gone or unregistered)."""

    @abc.abstractmethod
    def _dirs(self, path: str) -> list[Path]:
        """Every directory that makes up the cgroup, leaf first in the order rmdir needs."""

    def kill(self, path: str, timeout: float = 5.0) -> bool:
        """SIGKILL every process in the cgroup until it is empty; True if it emptied in time.

        Memory is unlimited first so tasks paused at their limit (v1 oom_kill_disable) can exit.
        """
        try:
            self._unlimit_memory(path)
        except OSError:
            pass
        deadline = time.monotonic() + timeout
        while True:
            pids = self.procs(path)
            if not pids:
                return True
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)

    @abc.abstractmethod
    def _unlimit_memory(self, path: str) -> None:
        """Lift the memory limit (used before killing, so paused tasks can die)."""

    def remove(self, path: str, timeout: float = 5.0) -> None:
        """Kill what is inside, then rmdir the cgroup (children first) in every hierarchy.

        Missing cgroups are fine.
        """
        self.forget(path)
        if not self.exists(path):
            return
        children = {c.name for d in self._dirs(path) for c in d.iterdir() if c.is_dir()}
        for name in sorted(children):
            self.remove(f"{path.rstrip('/')}/{name}", timeout)
        if not self.kill(path, timeout):
            raise RuntimeFailure(f"cgroup {path} did not empty within {timeout}s", path=path)
        deadline = time.monotonic() + timeout
        for d in self._dirs(path):
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:  # EBUSY while the last task is being reaped
                    if time.monotonic() > deadline:
                        raise RuntimeFailure(f"cannot remove cgroup {d}: {exc}", path=str(d)) from exc
                    time.sleep(0.01)
