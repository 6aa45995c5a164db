"""`Fd`: one owned file descriptor, closed exactly once by whoever holds the object.

A bare `int` handed between functions and threads is how double closes happen: the second
`os.close(n)` of a number that another thread has meanwhile reused closes that thread's file
(seen here: `shutil.rmtree` losing its directory fd, EBADF and EINVAL in unrelated execs). Like
CPython's `socket.socket` and `subprocess.Popen`, an `Fd` keeps the number private:

- `close()` closes it once and is idempotent (a lock makes two racing closes one);
- `fileno()` after the close raises `ClosedFd` (a `ValueError`, as a closed file's does) instead
  of returning a number that may name somebody else's file by now;
- an `EBADF` from our own close is never swallowed: the number was closed behind our back, which
  is a bug to surface, not to hide;
- `detach()` hands the number to a new owner (a `socket`, a child process) and forgets it;
- an `Fd` garbage-collected while open closes itself and warns (`ResourceWarning`), as files do.

Selectors and event loops take an `Fd` wherever they take a file object (it has `fileno()`).
Passing ownership between threads is explicit: the receiver takes the object, the giver drops
its reference (see `rollstack.run.execpump.ExecControl`).
"""

from __future__ import annotations

import os
import threading
import warnings


class ClosedFd(ValueError):
    """Use of an `Fd` after its close: a bug in the caller (never a reused number)."""


class Fd:
    """One owned descriptor (see the module docstring)."""

    __slots__ = ("_fd", "_lock", "name", "__weakref__")

    def __init__(self, fd: int, name: str = "") -> None:
        if fd < 0:
            raise ValueError(f"not a descriptor: {fd}")
        self._fd = fd
        self._lock = threading.Lock()
        self.name = name
        """What the descriptor is, for messages and leak warnings."""

    @classmethod
    def open(cls, path: str | os.PathLike[str], flags: int, mode: int = 0o777, *,
             dir_fd: "Fd | None" = None) -> "Fd":
        """`os.open` (always O_CLOEXEC) as an owned descriptor."""
        base = dir_fd.fileno() if dir_fd is not None else None
        return cls(os.open(path, flags | os.O_CLOEXEC, mode, dir_fd=base), os.fspath(path))

    @classmethod
    def pipe(cls, name: str = "pipe") -> "tuple[Fd, Fd]":
        """A close-on-exec pipe as (read end, write end)."""
        r, w = os.pipe2(os.O_CLOEXEC)
        return cls(r, f"{name} (read)"), cls(w, f"{name} (write)")

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def fileno(self) -> int:
        fd = self._fd
        if fd < 0:
            raise ClosedFd(f"descriptor {self.name or '?'} is closed")
        return fd

    def close(self) -> bool:
        """Close it (True) or do nothing when already closed or detached (False)."""
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd < 0:
            return False
        os.close(fd)  # EBADF here means somebody closed our number: let it be seen
        return True

    def detach(self) -> int:
        """The number, whose new owner closes it; this object is closed from now on."""
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd < 0:
            raise ClosedFd(f"descriptor {self.name or '?'} is closed")
        return fd

    def __enter__(self) -> "Fd":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._fd < 0 else str(self._fd)
        return f"<Fd {state} {self.name}>"

    def __del__(self) -> None:
        fd = getattr(self, "_fd", -1)
        if fd >= 0:
            self._fd = -1
            warnings.warn(f"unclosed descriptor {fd} ({self.name})", ResourceWarning, stacklevel=2)
            try:
                os.close(fd)
            except OSError:
                pass  # interpreter shutdown; nothing to report to
