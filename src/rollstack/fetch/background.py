"""When background fill may use the network: a gate that keeps it genuinely low priority.

Background fill must never delay a foreground read (a read blocked on the network, or the
prefetch/readahead that feeds one). On a small node the cost of fill is not only link
bandwidth but CPU (the registry, decompression, hashing, disk writes), so the gate admits a
background request only when all of these hold:

- no foreground request is in flight (`foreground_started`/`foreground_finished`);
- the last foreground request ended at least `quiet` seconds ago (a program importing modules
  misses every few ms: fill waits for the burst to end, not for the gaps inside it);
- a token bucket refilled at `rate` bytes/s (a configured share of the link) has the request's
  bytes (`TokenBucket`, pure);
- at least `min_idle` cores were idle over the last 0.2 s (`host.cpuidle`): a command that
  computes without touching FUSE (tests, a build) is foreground work the gate cannot see
  otherwise, and what fill causes at normal priority (the network stack, a registry or peer on
  the same node, disk flushes) would take its CPU.

Every wait is counted (`paused`, `throttled`) and so is any request started while foreground
work was in flight (`started_during_foreground`, which the gate keeps at 0): tests assert the
mechanism by these counts, not by wall clock.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Iterator

import trio

IDLE_NICE = 19


@contextlib.contextmanager
def idle_thread() -> Iterator[None]:
    """Run the block with the calling (worker) thread at nice 19, then restore its niceness: a
    background fill request's decoding, hashing and disk writes yield the CPU to every
    environment (and to the FUSE thread). The heavy calls inside release the GIL (zstd, sha256
    of whole chunks, file writes), so the low-priority thread does not hold up the trio thread."""
    tid = 0  # PRIO_PROCESS with 0: the calling thread on Linux
    try:
        before = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, IDLE_NICE)
    except OSError:
        yield
        return
    try:
        yield
    finally:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, before)  # raising it back needs CAP_SYS_NICE (the daemon runs as root)
        except OSError:
            pass


@dataclass
class TokenBucket:
    """Bytes per second with a burst allowance (pure: the caller passes the clock)."""

    rate: float
    burst: float
    tokens: float = 0.0
    stamp: float = 0.0

    def wait_for(self, nbytes: int, now: float) -> float:
        """Seconds until `nbytes` may be sent; 0.0 means: taken now. A request bigger than the
        burst is admitted once the bucket is full (it then goes into debt)."""
        if self.rate <= 0:
            return 0.0
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        need = min(float(nbytes), self.burst)
        if self.tokens >= need:
            self.tokens -= nbytes
            return 0.0
        return (need - self.tokens) / self.rate


class BackgroundGate:
    def __init__(self, rate: float, quiet: float, burst: float | None = None, min_idle: float = 0.0,
                 meter: Any = None) -> None:
        self.bucket = TokenBucket(rate, burst if burst is not None else max(rate * 0.1, 1 << 20))
        self.quiet = quiet
        self.min_idle = min_idle
        if min_idle > 0 and meter is None:
            from rollstack.host.cpuidle import IdleMeter

            meter = IdleMeter()
        self.meter = meter
        self.cpu_waits = 0  # admission checks that found the node's CPUs busy
        self.active = 0
        self.last_foreground = float("-inf")
        self._idle = trio.Event()
        self._idle.set()
        self.paused = 0  # admissions that waited for foreground work to end / go quiet
        self.throttled = 0  # admissions that waited for bandwidth tokens
        self.admitted = 0
        self.started_during_foreground = 0

    def foreground_started(self) -> None:
        self.active += 1
        if self._idle.is_set():
            self._idle = trio.Event()

    def foreground_finished(self) -> None:
        self.active -= 1
        self.last_foreground = trio.current_time()
        if self.active == 0:
            self._idle.set()

    async def wait_quiet(self, quiet: float) -> None:
        """Returns once no foreground request is in flight and none ended in the last `quiet` s."""
        while True:
            if self.active:
                await self._idle.wait()
                continue
            since = trio.current_time() - self.last_foreground
            if since >= quiet:
                return
            await trio.sleep(quiet - since)

    async def admit(self, nbytes: int) -> None:
        """Returns when a background request of `nbytes` stored bytes may start."""
        waited = False
        while True:
            if self.active:
                waited = True
                await self._idle.wait()
                continue
            since = trio.current_time() - self.last_foreground
            if since < self.quiet:
                waited = True
                await trio.sleep(self.quiet - since)
                continue
            if self.min_idle > 0 and self.meter.idle() < self.min_idle:
                waited = True
                self.cpu_waits += 1
                await trio.sleep(self.meter.window)
                continue
            delay = self.bucket.wait_for(nbytes, trio.current_time())
            if delay > 0:
                self.throttled += 1
                await trio.sleep(delay)
                continue  # foreground may have started meanwhile: check again
            break
        if waited:
            self.paused += 1
        self.admitted += 1
        if self.active:  # cannot happen (no await since the check); counted to prove it
            self.started_during_foreground += 1

    def snapshot(self) -> dict[str, int | float]:
        return {"admitted": self.admitted, "paused": self.paused, "throttled": self.throttled,
                "started_during_foreground": self.started_during_foreground,
                "foreground_active": self.active, "rate_bytes_per_s": self.bucket.rate, "quiet_seconds": self.quiet,
                "cpu_waits": self.cpu_waits, "min_idle_cores": self.min_idle}
