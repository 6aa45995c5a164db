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


HELPER = "from rollstack.host import libc; libc.die_with_spawner(); import time; print('up', flush=True); time.sleep(600)"


def test_a_helper_dies_with_the_thread_that_spawned_it_even_when_stopped() -> None:
    import signal
    import subprocess
    import sys
    import threading

    procs: list[subprocess.Popen] = []

    def spawn() -> None:
        p = subprocess.Popen([sys.executable, "-c", HELPER], env=libc.spawner_env(), stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout is not None and p.stdout.readline() == "up\n"  # past die_with_spawner
        p.send_signal(signal.SIGSTOP)  # as a fork holds it (host.foreground)

    t = threading.Thread(target=spawn)
    t.start()
    t.join()  # the spawning thread ends: its child gets SIGKILL
    assert procs[0].wait(30) == -signal.SIGKILL


def test_a_helper_whose_spawner_is_gone_exits_and_one_run_by_hand_does_not() -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, libc.SPAWNER_ENV: "1"}  # not our parent: the spawner is gone
    assert subprocess.run([sys.executable, "-c", HELPER], env=env, timeout=60).returncode == 1
    env.pop(libc.SPAWNER_ENV)
    hand = "from rollstack.host import libc; libc.die_with_spawner(); print('ran')"
    assert subprocess.run([sys.executable, "-c", hand], env=env, capture_output=True, text=True,
                          timeout=60).stdout == "ran\n"
