"""fdwait.wait works for descriptor numbers past select()'s FD_SETSIZE (1024)."""

from __future__ import annotations

import os
import resource

from rollstack.host import fdwait


def test_wait_on_a_descriptor_above_1024():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    r, w = os.pipe()
    hi_r, hi_w = os.dup2(r, 2000), os.dup2(w, 2001)
    try:
        assert fdwait.wait([hi_r], 0.01) == []  # nothing to read: times out
        assert fdwait.wait([hi_w], 0.01, write=True) == [hi_w]
        os.write(hi_w, b"x")
        assert fdwait.wait([hi_r], 1.0) == [hi_r]
        os.close(hi_w)
        os.close(w)
        assert fdwait.wait([hi_r], 1.0) == [hi_r]  # data, then hang-up: still ready
    finally:
        for fd in (hi_r, r):
            os.close(fd)
        for fd in (hi_w, w):
            try:
                os.close(fd)
            except OSError:
                pass
