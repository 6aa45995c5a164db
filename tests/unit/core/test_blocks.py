"""core.blocks.BlockPipe: what a producer thread puts is read back in order, in any read sizes;
its error is raised to the reader; a stopped reader never leaves the producer blocked."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollstack.core.blocks import END, BlockPipe


def _produce(pipe: BlockPipe, items: list) -> threading.Thread:
    def run() -> None:
        for item in items:
            pipe.put(item)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@settings(max_examples=60, deadline=None)
@given(blocks=st.lists(st.binary(min_size=1, max_size=50), max_size=12),
       sizes=st.lists(st.integers(min_value=1, max_value=70), min_size=1, max_size=20))
def test_reads_return_the_blocks_in_order_n_bytes_at_a_time(blocks: list[bytes], sizes: list[int]) -> None:
    pipe = BlockPipe(maxblocks=2)
    t = _produce(pipe, [*blocks, END])
    want, got, i = b"".join(blocks), b"", 0
    while True:
        n = sizes[i % len(sizes)]
        i += 1
        data = pipe.read(n)
        assert len(data) == n or len(got) + len(data) == len(want)  # short only at the end
        if not data:
            break
        got += data
    t.join(5)
    assert got == want and pipe.read(5) == b"" and pipe.read() == b""


def test_read_all_and_the_producers_error() -> None:
    pipe = BlockPipe(4)
    _produce(pipe, [b"ab", b"cd", END]).join(5)
    assert pipe.read(1) == b"a" and pipe.read() == b"bcd"
    pipe = BlockPipe(4)
    _produce(pipe, [b"ab", OSError("upstream broke")]).join(5)
    assert pipe.read(2) == b"ab"
    with pytest.raises(OSError, match="upstream broke"):
        pipe.read(1)
    assert pipe.read(1) == b""  # the error ends the stream


def test_a_stopped_reader_releases_a_blocked_producer() -> None:
    pipe = BlockPipe(1)
    t = _produce(pipe, [b"x"] * 5)  # the queue holds one: put() waits
    pipe.stop()
    t.join(5)
    assert not t.is_alive() and pipe.stopped
