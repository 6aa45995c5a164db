"""Small, fast cgroupfs file helpers shared by the v1 and v2 backends.

Sampling 256 environments every 200 ms must cost well under 2% of a core, and in CPython an
open/read/close triple costs ~7 us per file while a `pread` on a cached descriptor costs ~1 us.
So samples go through `FdCache` (one descriptor per file per cgroup, closed on `forget`), and
writes (rare) open the file each time.
"""

from __future__ import annotations

import os
from pathlib import Path

UNLIMITED_V1 = 9223372036854771712
"""What v1 reports for "no limit" (PAGE_COUNTER_MAX in bytes, page-aligned)."""


def write_text(path: Path, value: str) -> None:
    """Write one value the way cgroupfs wants it: a single write() of the whole string."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)  # O_TRUNC: a no-op on cgroupfs, needed by fakes
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def read_text(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536).decode()
    finally:
        os.close(fd)


def parse_flat_keyed(data: bytes) -> dict[bytes, int]:
    """`key value` lines (cpu.stat, memory.events, oom_control) -> {key: int}."""
    out: dict[bytes, int] = {}
    for line in data.split(b"\n"):
        k, _, v = line.partition(b" ")
        if v:
            out[k] = int(v)
    return out


def parse_psi_some_total(data: bytes) -> int:
    """The `some ... total=N` microseconds of a PSI file (cpu.pressure / memory.pressure)."""
    line = data.split(b"\n", 1)[0]
    idx = line.rfind(b"total=")
    if not line.startswith(b"some") or idx < 0:
        raise ValueError(f"not a PSI file: {data[:80]!r}")
    return int(line[idx + 6 :])


class FdCache:
    """Read-only descriptors for one cgroup's files, in a fixed order, opened on first use.

    The cache owns them (the `fds` list handed to a sample is borrowed for that call). Not
    locked: a path's samples and its `forget` are serialized by the caller (the Provisioner's
    lock; `register` samples a path before it is registered, so before anything forgets it).
    """

    __slots__ = ("paths", "fds", "_extra")

    def __init__(self, paths: tuple[Path, ...] = ()) -> None:
        self.paths = paths
        self.fds: list[int] | None = None
        self._extra: dict[Path, int] = {}

    def open(self) -> list[int]:
        """Open every file of `paths` (all or none)."""
        fds: list[int] = []
        try:
            for p in self.paths:
                fds.append(os.open(p, os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        self.fds = fds
        return fds

    def read_all(self) -> list[bytes]:
        """pread every file of `paths` (opening them the first time)."""
        fds = self.fds or self.open()
        pread = os.pread
        return [pread(fd, 4096, 0) for fd in fds]

    def read(self, path: Path) -> bytes:
        """pread one file by path (for optional files probed separately)."""
        fd = self._extra.get(path)
        if fd is None:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            self._extra[path] = fd
        return os.pread(fd, 4096, 0)

    def close(self) -> None:
        """Close every descriptor once. They leave the cache before any is closed, so a second
        `close` finds nothing (never a number closed already, maybe reused by another thread),
        and an error (EBADF: closed behind our back) is raised once all are closed, not hidden."""
        fds, extra = self.fds or [], self._extra
        self.fds, self._extra = None, {}
        error: OSError | None = None
        for fd in fds + list(extra.values()):
            try:
                os.close(fd)
            except OSError as exc:
                error = error or exc
        if error is not None:
            raise error
