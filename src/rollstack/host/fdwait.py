"""Waiting for file descriptors without `select.select`, which fails on fd numbers >= 1024
(FD_SETSIZE): a node agent with a hundred environments has thousands of descriptors open."""

from __future__ import annotations

import select
from typing import Iterable


def wait(fds: Iterable[int], timeout: float | None, write: bool = False) -> list[int]:
    """The descriptors of `fds` readable (or writable, `write`) within `timeout` seconds (None:
    no limit); [] on timeout. Hang-up and error count as ready (the read/write then says why)."""
    p = select.poll()
    mask = (select.POLLOUT if write else select.POLLIN) | select.POLLERR | select.POLLHUP
    for fd in fds:
        p.register(fd, mask)
    ms = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
    return [fd for fd, _ in p.poll(ms)]
