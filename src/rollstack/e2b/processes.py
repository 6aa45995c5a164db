"""The process table of one E2B sandbox: envd's `process.Process` state over the node's exec.

Each process is one `NodeLocal.exec_attached` call (rollstack.contract.service) running in its own thread, with an
`ExecControl` (open stdin, signals). Output and the end are fanned out to the streams attached
to it (`Start`'s own stream, later `Connect`s) through their event loops' thread-safe queues.
As in envd, a process outlives the stream that started it: a client that drops its stream does
not end the command; the command ends by itself, by a signal, at the `timeout` its Start asked
for (the Connect deadline), or with the sandbox. An ended process leaves the table before its
end event is sent, so `List` after an end never shows it.

Pids are per-sandbox numbers handed out here (they are not the kernel's pids inside the
sandbox); tags are the client's names for processes.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal as signals
import threading
from dataclasses import dataclass, field

from pydantic import ValidationError

from rollstack.errors import InsufficientCapacity, InvalidRequest, NotFound, RollstackError
from rollstack.contract.models import ExecRequest
from rollstack.contract.service import NodeLocal, ProcessControl

log = logging.getLogger(__name__)

MAX_PROCESSES = 256
"""Processes one sandbox may run at once."""
FIRST_PID = 1000


@dataclass(frozen=True)
class Event:
    kind: str  # data | end
    stream: str = ""  # stdout | stderr (data)
    data: bytes = b""
    exit_code: int = 0
    exited: bool = True
    status: str = ""
    error: str | None = None


@dataclass
class Proc:
    pid: int
    cmd: str
    args: list[str]
    envs: dict[str, str]
    cwd: str | None
    tag: str | None
    control: ProcessControl
    end: Event | None = None
    signalled: int | None = None
    _subs: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue[Event]]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def subscribe(self, loop: asyncio.AbstractEventLoop) -> asyncio.Queue[Event]:
        """A queue of this process's events from now on (just the end if it has ended)."""
        q: asyncio.Queue[Event] = asyncio.Queue()
        with self._lock:
            if self.end is not None:
                q.put_nowait(self.end)
            else:
                self._subs.append((loop, q))
        return q

    def unsubscribe(self, q: asyncio.Queue[Event]) -> None:
        with self._lock:
            self._subs = [s for s in self._subs if s[1] is not q]

    def emit(self, event: Event) -> None:
        with self._lock:
            subs = list(self._subs)
            if event.kind == "end":
                self.end = event
                self._subs.clear()
        for loop, q in subs:
            try:
                loop.call_soon_threadsafe(q.put_nowait, event)
            except RuntimeError:  # that stream's loop is closed: nobody is listening there
                pass

    def signal(self, sig: int) -> bool:
        self.signalled = sig
        return self.control.signal(sig)


def end_event(exit_code: int, timed_out: bool, signalled: int | None, error: str | None = None) -> Event:
    """envd's end event: `exit status N`, or `signal: killed` (exit code -1) when we killed it."""
    if timed_out or (signalled is not None and exit_code in (128 + int(signalled), -1)):
        sig = signalled or signals.SIGKILL
        name = {signals.SIGKILL: "killed", signals.SIGTERM: "terminated"}.get(sig, f"signal {int(sig)}")
        return Event("end", exit_code=-1, exited=False, status=f"signal: {name}",
                     error=error or ("the command's timeout expired" if timed_out else None))
    return Event("end", exit_code=exit_code, exited=True, status=f"exit status {exit_code}", error=error)


class ProcessTable:
    """The processes of one sandbox (`service` environment `env_id`)."""

    def __init__(self, service: NodeLocal, env_id: str, base_env: dict[str, str] | None = None,
                 max_processes: int = MAX_PROCESSES) -> None:
        self.service, self.env_id = service, env_id
        self.base_env = dict(base_env or {})
        self.max_processes = max_processes
        self._procs: dict[int, Proc] = {}
        self._pids = itertools.count(FIRST_PID)
        self._lock = threading.Lock()

    def start(self, cmd: str, args: list[str], envs: dict[str, str], cwd: str | None,
              tag: str | None, stdin: bool, timeout: float | None,
              loop: asyncio.AbstractEventLoop) -> tuple[Proc, asyncio.Queue[Event]]:
        """Launch a process; returns it and a queue already attached to its events."""
        if not cmd:
            raise InvalidRequest("process.cmd must not be empty")
        if cwd is not None and not cwd.startswith("/"):
            raise InvalidRequest(f"cwd must be an absolute path, not {cwd!r}")
        for key, value in envs.items():
            if not key or "=" in key or "\x00" in key or "\x00" in value:
                raise InvalidRequest(f"invalid environment variable {key!r}")
        try:
            request = ExecRequest(argv=[cmd, *args], cwd=cwd, env={**self.base_env, **envs},
                                  timeout=timeout if timeout and timeout > 0 else None)
        except ValidationError as exc:
            raise InvalidRequest(f"invalid process: {exc.errors()[0].get('msg', exc)}") from None
        with self._lock:
            if len(self._procs) >= self.max_processes:
                raise InsufficientCapacity(f"sandbox {self.env_id} runs {len(self._procs)} processes already")
            if tag is not None and any(p.tag == tag for p in self._procs.values()):
                raise InvalidRequest(f"a process tagged {tag!r} is running already")
            proc = Proc(next(self._pids), cmd, list(args), dict(envs), cwd, tag, self.service.exec_control(open_stdin=stdin))
            self._procs[proc.pid] = proc
        queue = proc.subscribe(loop)
        thread = threading.Thread(target=self._run, args=(proc, request), daemon=True,
                                  name=f"rollstack-e2b-{self.env_id}-{proc.pid}")
        thread.start()
        return proc, queue

    def _run(self, proc: Proc, request: ExecRequest) -> None:
        def on_output(stream: str, data: bytes) -> None:
            proc.emit(Event("data", stream=stream, data=bytes(data)))

        try:
            result = self.service.exec_attached(self.env_id, request, on_output, proc.control)
            event = end_event(result.exit_code, result.timed_out, proc.signalled)
        except RollstackError as exc:
            event = end_event(-1, False, proc.signalled, error=f"{exc.code}: {exc.message}")
        except Exception as exc:  # noqa: BLE001 - the stream must end with a reason, never hang
            log.exception("process %d of sandbox %s failed", proc.pid, self.env_id)
            event = end_event(-1, False, proc.signalled, error=f"internal error: {type(exc).__name__}: {exc}")
        proc.control.finish()  # an exec refused before it started never attached its control
        with self._lock:
            self._procs.pop(proc.pid, None)
        proc.emit(event)

    def get(self, pid: int | None = None, tag: str | None = None) -> Proc:
        with self._lock:
            if pid is not None:
                proc = self._procs.get(pid)
            else:
                proc = next((p for p in self._procs.values() if tag is not None and p.tag == tag), None)
        if proc is None:
            what = f"pid {pid}" if pid is not None else f"tag {tag!r}"
            raise NotFound(f"no running process with {what} in sandbox {self.env_id}")
        return proc

    def list(self) -> list[Proc]:
        with self._lock:
            return sorted(self._procs.values(), key=lambda p: p.pid)

    def kill_all(self) -> None:
        for proc in self.list():
            proc.signal(signals.SIGKILL)
