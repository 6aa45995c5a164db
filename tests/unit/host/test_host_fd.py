"""`Fd` (rollstack.host.fd): one owned descriptor, closed exactly once by whoever holds it."""

from __future__ import annotations

import errno
import fcntl
import gc
import os
import selectors
import threading
import time

import pytest

from rollstack.host import fd as fdmod
from rollstack.host.fd import ClosedFd, Fd


def _is_open(n: int) -> bool:
    try:
        os.fstat(n)
        return True
    except OSError as exc:
        assert exc.errno == errno.EBADF
        return False


def test_close_closes_once_and_is_idempotent():
    r, w = Fd.pipe()
    n = r.fileno()
    assert not r.closed
    assert r.close() is True
    assert r.closed and not _is_open(n)
    assert r.close() is False  # a second close does nothing (no os.close of a stale number)
    assert r.close() is False
    w.close()


def test_with_block_closes():
    with Fd.open(os.devnull, os.O_RDONLY) as f:
        n = f.fileno()
        assert _is_open(n)
    assert f.closed and not _is_open(n)
    f.close()  # after the block: still a no-op


def test_fileno_after_close_raises_closed_fd():
    f = Fd.open(os.devnull, os.O_RDONLY)
    f.close()
    with pytest.raises(ClosedFd):
        f.fileno()
    assert issubclass(ClosedFd, ValueError)  # as a closed file's fileno() does
    assert "closed" in repr(f)


def test_open_is_cloexec_and_honours_dir_fd(tmp_path):
    (tmp_path / "x").write_bytes(b"hello")
    with Fd.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY) as d, \
            Fd.open("x", os.O_RDONLY, dir_fd=d) as f:
        assert fcntl.fcntl(f.fileno(), fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        assert os.pread(f.fileno(), 5, 0) == b"hello"
    r, w = Fd.pipe()
    with r, w:
        for end in (r, w):
            assert fcntl.fcntl(end.fileno(), fcntl.F_GETFD) & fcntl.FD_CLOEXEC


def test_a_negative_number_is_refused():
    with pytest.raises(ValueError):
        Fd(-1)


def test_detach_hands_the_number_over():
    f = Fd.open(os.devnull, os.O_RDONLY)
    n = f.detach()
    try:
        assert _is_open(n)  # the new owner has it
        assert f.closed
        assert f.close() is False  # the old owner closes nothing
        assert _is_open(n)
        with pytest.raises(ClosedFd):
            f.fileno()
        with pytest.raises(ClosedFd):
            f.detach()
    finally:
        os.close(n)


def test_racing_closes_close_once_and_leave_a_reused_number_alone(monkeypatch):
    """Many threads close the same Fd at once: os.close runs once for it, and the number,
    reused by a new open meanwhile, stays open (the bug of issue 35 closed that file)."""
    real_close = os.close
    calls: list[int] = []

    def slow_close(n: int) -> None:
        calls.append(n)
        time.sleep(0.01)  # widen the window between taking the number and closing it
        real_close(n)

    for _ in range(20):
        f = Fd.open(os.devnull, os.O_RDONLY)
        n = f.fileno()
        calls.clear()
        barrier = threading.Barrier(8)
        results: list[bool] = []

        def closer() -> None:
            barrier.wait()
            results.append(f.close())

        monkeypatch.setattr(fdmod.os, "close", slow_close)
        threads = [threading.Thread(target=closer) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        monkeypatch.setattr(fdmod.os, "close", real_close)
        assert sorted(results) == [False] * 7 + [True]
        assert calls == [n]
        reused = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            assert reused == n  # lowest free number: the one just closed
            assert f.close() is False  # late closers still close nothing
            assert _is_open(reused)
        finally:
            real_close(reused)


def test_ebadf_from_our_own_close_surfaces():
    r, w = Fd.pipe()
    os.close(r.fileno())  # somebody closed our number behind our back
    with pytest.raises(OSError) as exc:
        r.close()
    assert exc.value.errno == errno.EBADF
    assert r.closed
    assert r.close() is False  # reported once; not retried on a number that is not ours
    w.close()


def test_garbage_collected_while_open_closes_and_warns():
    f = Fd.open(os.devnull, os.O_RDONLY)
    n = f.fileno()
    with pytest.warns(ResourceWarning, match=f"unclosed descriptor {n}"):
        del f
        gc.collect()
    assert not _is_open(n)


def test_garbage_collected_after_close_or_detach_is_quiet(recwarn):
    f = Fd.open(os.devnull, os.O_RDONLY)
    f.close()
    g = Fd.open(os.devnull, os.O_RDONLY)
    n = g.detach()
    del f, g
    gc.collect()
    assert _is_open(n)  # detached: the GC of the old owner left it alone
    os.close(n)
    assert not [w for w in recwarn if issubclass(w.category, ResourceWarning)]


def test_selectors_take_an_fd():
    r, w = Fd.pipe()
    with r, w, selectors.DefaultSelector() as sel:
        key = sel.register(r, selectors.EVENT_READ, "data")
        assert key.fd == r.fileno()
        assert sel.select(0) == []
        os.write(w.fileno(), b"x")
        [(ready, events)] = sel.select(1.0)
        assert ready.fileobj is r and events == selectors.EVENT_READ and ready.data == "data"
        assert os.read(r.fileno(), 1) == b"x"
        sel.unregister(r)  # before the close: a selector looks the number up through fileno()
    with selectors.DefaultSelector() as sel:
        with pytest.raises(ValueError):  # a closed Fd is refused, not looked up by a stale number
            sel.register(r, selectors.EVENT_READ)
