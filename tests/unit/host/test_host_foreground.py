"""`Foreground`: holds stop registered background processes and continue them, on real
child processes (SIGSTOP / SIGCONT through pidfds)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollstack.host.foreground import Foreground

DEADLINE = 30.0  # a generous wait on a condition, never a speed assertion


def _state(pid: int) -> str:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2]


def _wait_state(pid: int, stopped: bool) -> None:
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        if (_state(pid) == "T") == stopped:
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} is {'not ' if stopped else ''}stopped after {DEADLINE} s")


def _wait_until(cond) -> None:
    end = time.monotonic() + DEADLINE
    while not cond():
        assert time.monotonic() < end, "condition not met"
        time.sleep(0.01)


@pytest.fixture
def child():
    procs: list[subprocess.Popen] = []

    def spawn() -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
        procs.append(p)
        return p

    yield spawn
    for p in procs:
        p.kill()  # a stopped process dies of it too
        p.wait(DEADLINE)


def test_a_hold_stops_a_registered_process_until_the_last_release(child):
    fg, p, other = Foreground(), child(), child()
    fg.register(p.pid)
    with fg.hold():
        _wait_state(p.pid, stopped=True)
        with fg.hold():
            pass
        assert _state(p.pid) == "T"  # an inner release does not continue it
        assert _state(other.pid) != "T"  # an unregistered process is never touched
    _wait_state(p.pid, stopped=False)
    assert fg.counters["stops"] == 1 and fg.counters["holds"] == 2
    fg.close()


def test_a_stop_that_outlasts_max_hold_is_continued_until_the_holds_end(child):
    fg, p = Foreground(max_hold=0.2), child()
    fg.register(p.pid)
    with fg.hold():
        _wait_state(p.pid, stopped=True)
        _wait_state(p.pid, stopped=False)  # the watchdog continued it, the hold still open
        with fg.hold():  # overlapping holds do not stop it again
            time.sleep(0.05)
            assert _state(p.pid) != "T"
    assert fg.counters["expired"] == 1
    _wait_until(lambda: time.monotonic() >= fg._run_until)  # it ran as long as it was stopped
    with fg.hold():  # a new run of holds stops it again
        _wait_state(p.pid, stopped=True)
    _wait_state(p.pid, stopped=False)
    fg.close()


def test_after_a_stop_the_process_runs_as_long_before_the_next(child):
    fg, p = Foreground(), child()
    fg.register(p.pid)
    with fg.hold():
        _wait_state(p.pid, stopped=True)
        time.sleep(1.0)  # a long stop ...
    with fg.hold():  # ... so the next hold, right after, leaves it running
        assert _state(p.pid) != "T" and fg.counters["stops"] == 1
    _wait_until(lambda: time.monotonic() >= fg._run_until)
    with fg.hold():  # once it ran that long, holds stop it again
        _wait_state(p.pid, stopped=True)
    assert fg.counters["stops"] == 2
    fg.close()


def test_register_during_a_stop_and_unregister_of_a_stopped_process(child):
    fg, first, late = Foreground(), child(), child()
    fg.register(first.pid)
    with fg.hold():
        fg.register(late.pid)  # joins the stopped set
        _wait_state(late.pid, stopped=True)
        fg.unregister(first.pid)  # continued at once: its owner may signal it now
        _wait_state(first.pid, stopped=False)
        first.terminate()
        assert first.wait(DEADLINE) != 0
    _wait_state(late.pid, stopped=False)
    fg.close()


def test_an_exited_and_reaped_process_is_never_signalled(child):
    fg, p = Foreground(), child()
    fg.register(p.pid)
    p.kill()
    p.wait(DEADLINE)  # reaped: its pid may be reused; the pidfd still names the dead one
    with fg.hold():
        pass
    fg.unregister(p.pid)
    fg.register(p.pid)  # no such process any more: nothing registered
    assert fg.counters["stops"] == 1
    fg.close()


def test_close_continues_everything_and_later_holds_stop_nothing(child):
    fg, p = Foreground(), child()
    fg.register(p.pid)
    cm = fg.hold()
    cm.__enter__()
    _wait_state(p.pid, stopped=True)
    fg.close()
    _wait_state(p.pid, stopped=False)
    cm.__exit__(None, None, None)
    with fg.hold():
        assert _state(p.pid) != "T"


def test_max_hold_must_be_positive():
    with pytest.raises(ValueError):
        Foreground(max_hold=0)
