"""Idle cores from /proc/stat readings (pure parsing and arithmetic, a fake clock and file)."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from rollstack.host.cpuidle import IdleMeter, cpu_times, idle_cores

STAT = "cpu  {u} 0 {s} {i} {w} 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 1\n"


def test_cpu_times_reads_the_aggregate_line():
    assert cpu_times(STAT.format(u=10, s=5, i=80, w=5)) == (85, 100)
    with pytest.raises(ValueError):
        cpu_times("intr 1 2\n")


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(1, 64))
def test_idle_cores_is_bounded_by_the_cpu_count(busy, idle, cpus):
    v = idle_cores((0, 0), (idle, idle + busy), cpus)
    assert 0.0 <= v <= cpus
    if busy + idle:
        assert v == pytest.approx(idle / (idle + busy) * cpus)
    assert idle_cores((5, 9), (5, 9), cpus) == cpus  # no time passed: nothing known to be busy


def test_the_meter_refreshes_once_per_window():
    texts = iter([STAT.format(u=0, s=0, i=0, w=0), STAT.format(u=150, s=0, i=50, w=0),
                  STAT.format(u=150, s=0, i=250, w=0)])
    now = [0.0]
    m = IdleMeter(window=0.2, cpus=2, read=lambda: next(texts), clock=lambda: now[0])
    assert m.idle() == 2.0  # before one window passed
    now[0] = 0.25
    assert m.idle() == pytest.approx(0.5)  # 50 of 200 jiffies idle on 2 cores
    now[0] = 0.3
    assert m.idle() == pytest.approx(0.5)  # same window: not re-read
    now[0] = 0.5
    assert m.idle() == pytest.approx(2.0)
