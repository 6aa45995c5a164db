"""The E2B process table's own logic (end events, selection, limits, fan-out) over a scripted
service; the real exec path is covered by tests/integration/e2b."""

from __future__ import annotations

import asyncio
import signal
import threading

import pytest

from rollstack.e2b.processes import ProcessTable, end_event
from rollstack.errors import EnvironmentGone, InsufficientCapacity, InvalidRequest, NotFound
from rollstack.contract.models import ExecResult
from rollstack.run.execpump import ExecControl


def test_end_events_follow_envd():
    assert end_event(0, False, None) .status == "exit status 0"
    e = end_event(3, False, None)
    assert (e.exit_code, e.exited, e.error) == (3, True, None)
    k = end_event(137, False, signal.SIGKILL)
    assert (k.exit_code, k.exited, k.status) == (-1, False, "signal: killed")
    t = end_event(124, True, None)
    assert t.status == "signal: killed" and "timeout" in t.error
    assert end_event(0, False, signal.SIGTERM).status == "exit status 0"  # handled the signal


class Scripted:
    """exec_attached that emits output then waits for `release` (or raises `error`)."""

    def __init__(self, error: Exception | None = None) -> None:
        self.release = threading.Event()
        self.error = error
        self.requests = []

    @staticmethod
    def exec_control(open_stdin=False):
        return ExecControl(open_stdin=open_stdin)

    def exec_attached(self, env_id, request, on_output, control):
        self.requests.append(request)
        on_output("stdout", b"out")
        self.release.wait(10)
        if self.error:
            raise self.error
        return ExecResult(exit_code=2)


def test_start_fanout_end_and_table_cleanup():
    service = Scripted()
    table = ProcessTable(service, "e1", base_env={"A": "1"})

    async def scenario():
        loop = asyncio.get_running_loop()
        proc, q = table.start("/bin/sh", ["-c", "x"], {"B": "2"}, "/tmp", "t", False, 5.0, loop)
        assert table.get(tag="t") is proc and table.get(pid=proc.pid) is proc
        assert (await q.get()).data == b"out"
        late = proc.subscribe(loop)
        service.release.set()
        end = await q.get()
        assert (end.kind, end.exit_code) == ("end", 2)
        assert (await late.get()).kind == "end"
        assert proc.subscribe(loop).get_nowait() is end  # after the end: just the end
        assert table.list() == []

    asyncio.run(scenario())
    req = service.requests[0]
    assert req.env == {"A": "1", "B": "2"} and req.cwd == "/tmp" and req.timeout == 5.0
    with pytest.raises(NotFound):
        table.get(pid=10**6)


def test_errors_become_end_events_and_limits_hold():
    service = Scripted(error=EnvironmentGone("environment e1 is destroying"))
    table = ProcessTable(service, "e1", max_processes=1)

    async def scenario():
        loop = asyncio.get_running_loop()
        proc, q = table.start("sleep", ["1"], {}, None, None, False, None, loop)
        with pytest.raises(InsufficientCapacity):
            table.start("sleep", ["1"], {}, None, None, False, None, loop)
        service.release.set()
        await q.get()
        end = await q.get()
        assert end.exit_code == -1 and "environment_gone" in end.error

    asyncio.run(scenario())
    with pytest.raises(InvalidRequest):
        table.start("x", [], {}, "relative", None, False, None, asyncio.new_event_loop())
    with pytest.raises(InvalidRequest):
        table.start("x", [], {"BAD=KEY": "v"}, None, None, False, None, asyncio.new_event_loop())
