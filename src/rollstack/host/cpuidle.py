"""How much CPU the node leaves idle right now: background work waits for it (`IdleMeter`).

Background fill and materialization run at the lowest priorities, but what they cause runs at
normal priority: the network stack receiving their bytes, the disk flushing their writes, a
registry or peer on the same node serving them. So they also wait until the node's CPUs are
actually idle: `/proc/stat`'s idle + iowait time, over the last `window` seconds, in cores.
"""

from __future__ import annotations

import os
import time
from typing import Callable

STAT = "/proc/stat"


def cpu_times(text: str) -> tuple[int, int]:
    """(idle + iowait, total) jiffies of the aggregate `cpu` line of a /proc/stat text (pure)."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            values = [int(v) for v in parts[1:9]]  # user nice system idle iowait irq softirq steal
            if len(values) < 5:
                break
            return values[3] + values[4], sum(values)
    raise ValueError("no aggregate cpu line in /proc/stat")


def idle_cores(before: tuple[int, int], after: tuple[int, int], cpus: int) -> float:
    """Idle cores between two `cpu_times` readings (pure); `cpus` when no time passed."""
    didle, dtotal = after[0] - before[0], after[1] - before[1]
    if dtotal <= 0:
        return float(cpus)
    return max(0.0, min(1.0, didle / dtotal)) * cpus


class IdleMeter:
    """Idle cores over the last `window` seconds; the reading is refreshed at most once per
    window, so callers may ask as often as they like."""

    def __init__(self, window: float = 0.2, cpus: int | None = None,
                 read: Callable[[], str] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self.cpus = cpus or os.cpu_count() or 1
        self._read = read or _read_stat
        self._clock = clock
        self._last = (clock(), cpu_times(self._read()))
        self._value = float(self.cpus)

    def idle(self) -> float:
        now = self._clock()
        t0, times0 = self._last
        if now - t0 >= self.window:
            times = cpu_times(self._read())
            self._value = idle_cores(times0, times, self.cpus)
            self._last = (now, times)
        return self._value


def _read_stat() -> str:
    with open(STAT) as f:
        return f.read()


def idle_pacer(min_idle: float, meter: "IdleMeter | None" = None, max_wait: float = 60.0,
               sleep: Callable[[float], None] = time.sleep,
               until: Callable[[], bool] | None = None) -> Callable[[], float]:
    """A `pace()` for background work: waits until `min_idle` cores were idle over the meter's
    window, at most `max_wait` s per call (a node that is never idle still makes progress) and
    not once `until()` is true (someone waits for the work); returns the seconds waited."""
    m = meter if meter is not None else IdleMeter()

    def pace() -> float:
        waited = 0.0
        while min_idle > 0 and waited < max_wait and not (until is not None and until()) and m.idle() < min_idle:
            step = m.window
            sleep(step)
            waited += step
        return waited

    return pace
