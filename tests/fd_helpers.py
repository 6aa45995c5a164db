"""Descriptor audits for tests: a double close made visible, a leak counted.

`FdAudit` wraps `os.close` for the whole process while it is active: every close that fails
with EBADF is recorded with its thread and stack. An EBADF is the visible half of a double
close: the same number closed twice, where the second close usually finds it free (EBADF) and
sometimes finds it reused by another thread (that thread's file closed under it: the data-loss
half, invisible). Code that owns its descriptors (`rollstack.host.fd.Fd`) never closes a number
twice, so a run with any EBADF recorded has an ownership bug, whichever half it hit.
"""

from __future__ import annotations

import errno
import os
import threading
import traceback


class FdAudit:
    """`with FdAudit() as audit: ...; assert not audit.ebadf, audit.report()`."""

    def __init__(self) -> None:
        self.ebadf: list[str] = []
        self._real = os.close
        self._lock = threading.Lock()

    def _close(self, fd: int) -> None:
        try:
            self._real(fd)
        except OSError as e:
            if e.errno == errno.EBADF:
                where = "".join(traceback.format_stack(limit=8)[:-1])
                with self._lock:
                    self.ebadf.append(f"close({fd}) in {threading.current_thread().name}:\n{where}")
            raise

    def __enter__(self) -> "FdAudit":
        os.close = self._close
        return self

    def __exit__(self, *exc: object) -> None:
        os.close = self._real

    def report(self) -> str:
        return f"{len(self.ebadf)} close(s) of a closed descriptor; first:\n" + "\n".join(self.ebadf[:3])


def open_fds() -> int:
    """How many descriptors this process holds now."""
    return len(os.listdir("/proc/self/fd"))
