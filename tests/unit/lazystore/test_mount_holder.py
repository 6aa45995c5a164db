"""The fd-holder's protocol over a real unix socket, holding a pipe instead of /dev/fuse."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from rollstack.lazystore import holder


@pytest.fixture
def held(tmp_path: Path):
    """A holder serving in a thread: (state dir, write end of the held pipe, thread, result)."""
    r, w = os.pipe()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(holder.socket_path(tmp_path)))
    listener.listen(4)
    grace = {"value": 30.0}
    t = threading.Thread(target=lambda: holder.serve(listener, r, grace["value"]), daemon=True)
    yield tmp_path, w, t, grace
    os.close(w)
    listener.close()


def _own(state: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(holder.socket_path(state)))
    s.sendall(b"OWN\n")
    assert s.recv(16) == b"OK\n"
    return s


def _wait_for(pred, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.01)
    return pred()


def test_owner_death_then_takeover_hands_over_the_same_fd(held):
    state, w, t, _ = held
    t.start()
    owner = _own(state)
    assert holder.ping(state) == "owned"
    assert holder.take(state) is None  # BUSY: a live daemon owns it
    owner.close()  # the daemon died
    assert _wait_for(lambda: holder.ping(state) == "orphaned")
    taken = holder.take(state)
    assert taken is not None
    fd, successor = taken
    os.write(w, b"same pipe")
    assert os.read(fd, 64) == b"same pipe"  # the descriptor the holder kept
    assert holder.ping(state) == "owned"
    os.close(fd)
    holder.release(successor)
    t.join(5)
    assert not t.is_alive()  # RELEASE: the holder let go and returned


def test_without_a_successor_the_holder_gives_up_after_the_grace(held):
    state, w, t, grace = held
    grace["value"] = 0.3
    t.start()
    _own(state).close()
    t.join(5)
    assert not t.is_alive()
    with pytest.raises(OSError):
        os.write(w, b"x")  # the holder closed the read end: nobody holds the pipe any more


def test_garbage_and_strangers_do_not_take_or_stop_it(held):
    state, _, t, _ = held
    t.start()
    owner = _own(state)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(holder.socket_path(state)))
    s.sendall(b"\x00\xffnonsense\n")
    assert s.recv(16) == b"BUSY\n"
    s.close()
    assert holder.ping(state) == "owned" and t.is_alive()
    holder.release(owner)
    t.join(5)


def test_no_holder_answers_none(tmp_path):
    assert holder.ping(tmp_path) is None
    assert holder.take(tmp_path) is None
    assert holder.pids(tmp_path) == []


def test_init_request_is_a_well_formed_fuse_init():
    msg = holder.init_request()
    length, opcode, unique = struct.unpack_from("<IIQ", msg)
    assert length == len(msg) == 40 + 16
    assert opcode == holder.FUSE_INIT
    assert unique >= 1 << 62  # the kernel counts request ids up from 0: the reply matches none
    major, minor, _readahead, flags = struct.unpack_from("<IIII", msg, 40)
    assert (major, minor) == (7, 38)
    assert flags & (1 << 13)  # FUSE_DO_READDIRPLUS: pyfuse3 refuses a kernel without it
