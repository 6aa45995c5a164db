"""`Foreground`: a node's latency-critical work holds its background processes stopped.

SCHED_IDLE, nice 19 and the background cgroup (host.background) keep a layer extraction or an
EROFS build to what the environments leave, but they cannot keep it off the cores for the few
tens of milliseconds of a fork's cut and binds: on 2 cores the extraction ran beside them and a
fork of 8 took 74 ms instead of 60 (docs/benchmarks.md, "A fork beside the node's background
work"). While at least one `hold()` is open, every registered process is stopped (SIGSTOP); the
last release continues them (SIGCONT).

- Bounded: a stop that lasts `max_hold` seconds (holds overlapping back to back) continues the
  processes until the holds have all ended, and after any stop they run at least as long as
  they were stopped before a hold may stop them again (forks one after the other hold them half
  the time at most), so background work is delayed, never starved.
- One owner per process: its spawner registers it after the spawn and unregisters it once it
  has exited, or before it signals it (a stopped process is continued first, so a SIGTERM takes
  effect). Signals go through a pidfd, never to a PID that may have been reused.
- A process that exits while stopped or registered costs nothing: signalling it is a no-op.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from typing import Iterator

log = logging.getLogger(__name__)

MAX_HOLD = 1.0
"""Seconds the background processes stay stopped at most in a row."""


class Foreground:
    def __init__(self, max_hold: float = MAX_HOLD) -> None:
        if max_hold <= 0:
            raise ValueError("max_hold must be > 0")
        self.max_hold = max_hold
        self._lock = threading.Condition()
        self._holds = 0
        self._fds: dict[int, int] = {}  # pid -> pidfd
        self._stopped_at: float | None = None  # the processes are stopped since
        self._expired = False  # this run of holds outlasted max_hold: processes run until it ends
        self._run_until = 0.0  # after a stop, no new one before (as long as the stop lasted)
        self._watchdog: threading.Thread | None = None
        self._closed = False
        self.counters = {"holds": 0, "stops": 0, "expired": 0}

    # -- the spawner's side -----------------------------------------------------------------
    def register(self, pid: int) -> None:
        """Process `pid` (a child of the caller, not yet reaped) is background work: stopped
        now if the processes are."""
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # exited and reaped already, or pidfds unsupported: nothing to hold
            return
        with self._lock:
            old = self._fds.pop(pid, None)
            if old is not None:
                os.close(old)
            self._fds[pid] = fd
            if self._stopped_at is not None:
                _signal(fd, signal.SIGSTOP)

    def unregister(self, pid: int) -> None:
        """`pid` is no longer held: continued if it was stopped."""
        with self._lock:
            fd = self._fds.pop(pid, None)
            if fd is None:
                return
            if self._stopped_at is not None:
                _signal(fd, signal.SIGCONT)
            os.close(fd)

    # -- the foreground's side --------------------------------------------------------------
    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Background processes stopped for the block (at most `max_hold` s in a row)."""
        with self._lock:
            self._holds += 1
            self.counters["holds"] += 1
            if self._holds == 1:
                self._expired = False
            if self._stopped_at is None and not self._expired and self._fds and not self._closed \
                    and time.monotonic() >= self._run_until:
                self._stop_all()
        try:
            yield
        finally:
            with self._lock:
                self._holds -= 1
                if self._holds == 0:
                    self._expired = False
                    self._cont_all()

    def close(self) -> None:
        """Continue and forget every process (the node stops)."""
        with self._lock:
            self._cont_all()
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
            self._closed = True
            self._lock.notify_all()

    # -- internals (under the lock) -----------------------------------------------------------
    def _stop_all(self) -> None:
        if self._watchdog is None:  # first: no stop without the thread that bounds it
            try:
                watchdog = threading.Thread(target=self._watch, name="foreground-watchdog", daemon=True)
                watchdog.start()
            except RuntimeError as exc:  # no thread to be had: the processes run on
                log.warning("no watchdog thread (%s): background work is not held", exc)
                return
            self._watchdog = watchdog
        for fd in self._fds.values():
            _signal(fd, signal.SIGSTOP)
        self._stopped_at = time.monotonic()
        self.counters["stops"] += 1
        self._lock.notify_all()

    def _cont_all(self) -> None:
        if self._stopped_at is None:
            return
        for fd in self._fds.values():
            _signal(fd, signal.SIGCONT)
        now = time.monotonic()
        self._run_until = now + (now - self._stopped_at)
        self._stopped_at = None

    def _watch(self) -> None:
        """Continues processes stopped for `max_hold` (one thread for the object's life)."""
        with self._lock:
            while not self._closed:
                if self._stopped_at is None:
                    self._lock.wait()
                    continue
                left = self._stopped_at + self.max_hold - time.monotonic()
                if left > 0:
                    self._lock.wait(left)
                    continue
                self._expired = True
                self.counters["expired"] += 1
                self._cont_all()


def _signal(pidfd: int, sig: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        pass  # it exited; its spawner reaps and unregisters it
    except OSError as exc:  # noqa: BLE001 - a process we cannot hold runs on
        log.warning("signal %s to a background process failed: %s", sig, exc)
