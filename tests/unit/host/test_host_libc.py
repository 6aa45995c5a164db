"""`host.libc`: one loaded C library whose calls report the errno (the mount and syscall paths of
run.overlay, run.userns, lowers.erofs and host.umount go through it)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from rollstack.host import libc


def test_mount_reports_the_errno(tmp_path: Path) -> None:
    assert libc.mount(b"none", tmp_path / "missing", b"tmpfs") == errno.ENOENT
    assert libc.mount(b"none", tmp_path, b"no-such-filesystem") in (errno.ENODEV, errno.EPERM)


def test_umount2_of_something_not_mounted(tmp_path: Path) -> None:
    assert libc.umount2(tmp_path) in (errno.EINVAL, errno.EPERM)


def test_a_failing_syscall_raises_with_its_errno() -> None:
    with pytest.raises(OSError) as info:
        libc.syscall(-1)
    assert info.value.errno == errno.ENOSYS


def _rss_mib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) // 1024


def test_malloc_trim_gives_a_threads_freed_memory_back() -> None:
    """A thread allocates ~200 MB in its own malloc arena and frees 99% of it, scattered (the
    arena's top cannot shrink): the memory stays resident until malloc_trim hands it back."""
    import threading

    kept: list[bytes] = []

    def churn() -> None:
        blocks = [bytes(4000) + bytes([i % 256]) for i in range(50_000)]
        kept.extend(blocks[::100])

    worker = threading.Thread(target=churn)
    worker.start()
    worker.join()
    before = _rss_mib()
    assert libc.malloc_trim()
    assert _rss_mib() < before - 100, (before, _rss_mib())
    assert len(kept) == 500
