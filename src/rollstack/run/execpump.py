"""One `runc exec` in flight: wiring its fds, pumping stdin/stdout/stderr, the timeout.

`rollstack.run.runc.Runc.exec` builds the command line (see its module docstring for why the
command's stdio travels as runc's preserved fds 3/4/5); this module runs it: spawn runc with
posix_spawn (fds placed exactly, thread-safe), select over the pipes and a pidfd of runc,
cap and stream output, kill the command's whole tree on timeout.

Size (~400 lines): the request checks, the spawn and the pump loop share one set of fds and
one deadline; the stdin write loop is shared with the exec agent's pump (`write_pending`).
"""

from __future__ import annotations

import errno
import os
import re
import selectors
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from rollstack.errors import EnvironmentGone, InvalidRequest, RuntimeFailure
from rollstack.host import fdwait
from rollstack.host.fd import Fd
from rollstack.run.procs import ProcRef, kill_tree, reap, ref

DEFAULT_OUTPUT_LIMIT = 16 * 1024 * 1024
TIMEOUT_EXIT_CODE = 124
OnOutput = Callable[[str, bytes], None]


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one command."""

    exit_code: int
    """The command's exit status; 128+N when killed by signal N; 124 when timed out."""
    stdout: bytes
    stderr: bytes
    duration: float
    """Seconds from spawning `runc exec` to the command's end."""
    timed_out: bool = False
    truncated: bool = False
    """True when stdout or stderr exceeded the output limit and was cut."""



class ExecControl:
    """A caller's handle on one exec in flight: a stdin it writes while the command runs,
    signals, the command's host pid. Thread-safe; used by long-lived processes (rollstack.e2b).

    With `open_stdin`, the command's stdin is a pipe that stays open until `close_stdin()` (or
    the command's end) instead of a fixed buffer. `signal(SIGKILL)` ends the command's whole
    tree (as a timeout does); other signals go to the command's process group (through tini on
    the runc path, through the exec agent's shim otherwise). Everything is a no-op returning
    False once the command has ended.

    The exec in flight (an `ExecPump` or a `rollstack.run.agent.AgentPump`) attaches itself as
    the backend: `_signal(sig, wait)` and `_exec_pid(wait)` are all a control asks of it.
    """

    def __init__(self, open_stdin: bool = False) -> None:
        self.open_stdin = open_stdin
        self._lock = threading.Lock()
        self._stdin: Fd | None = None
        """The open stdin's write end, owned here from `_attach` on (closed by us only)."""
        self._backend: Any = None
        self.started = threading.Event()
        """Set once the command is being started (stdin usable) or the exec failed before that."""
        self.ended = threading.Event()

    def check(self, stdin: bytes | None) -> None:
        """InvalidRequest (and the control finished) for a fixed stdin and an open stream both."""
        if self.open_stdin and stdin is not None:
            self.finish()
            raise InvalidRequest("stdin is either a buffer or an open stream, not both")

    def _attach(self, backend: Any, stdin: Fd | None) -> None:
        """The exec started: `backend` serves signals; `stdin` (the open stdin's write end,
        with `open_stdin`) is ours from now on, the exec keeps no reference to it."""
        with self._lock:
            self._backend, self._stdin = backend, stdin
            if stdin is not None:
                os.set_blocking(stdin.fileno(), False)
        self.started.set()

    def _detach(self) -> None:
        with self._lock:
            self._backend = None
            if self._stdin is not None:
                self._stdin.close()
                self._stdin = None
        self.started.set()
        self.ended.set()

    def finish(self) -> None:
        """Mark the exec over (idempotent): for callers whose exec failed before it started."""
        self._detach()

    def pid(self, wait: float = 2.0) -> int | None:
        """The host pid of the command's tini on the runc path; None on the exec agent's path
        (its command's pid is not reported to the node), before it started or after it ended."""
        backend = self._backend
        return backend._exec_pid(wait) if backend is not None else None

    def write_stdin(self, data: bytes, timeout: float = 30.0) -> bool:
        """Write all of `data` to the command's stdin; False if stdin is closed or the command
        ended. Raises InvalidRequest if the command does not read it within `timeout`."""
        self.started.wait(timeout)
        with self._lock:  # the descriptor cannot be closed while we write to it
            if self._stdin is None:
                return False
            fd = self._stdin.fileno()
            view, deadline = memoryview(data), time.monotonic() + timeout
            while view:
                try:
                    n = os.write(fd, view[:65536])
                    view = view[n:]
                    continue
                except BlockingIOError:
                    pass
                except OSError:  # EPIPE: the command closed its stdin or ended
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    raise InvalidRequest(f"the command did not read its stdin within {timeout:g} s")
                fdwait.wait([fd], min(left, 0.5), write=True)
            return True

    def close_stdin(self) -> bool:
        self.started.wait(30.0)
        with self._lock:
            if self._stdin is None:
                return False
            self._stdin.close()
            self._stdin = None
            return True

    def signal(self, sig: int, wait: float = 10.0) -> bool:
        """Send `sig` (waiting up to `wait` s for the command to exist); False if it has ended.
        InvalidRequest for a number that is no signal."""
        if sig not in signal.valid_signals():
            raise InvalidRequest(f"not a signal: {sig}")
        self.started.wait(30.0)
        backend = self._backend
        return bool(backend is not None and backend._signal(sig, wait))


def capture(buf: bytearray, limit: int, name: str, chunk: bytes,
            on_output: OnOutput | None) -> bool:
    """Keep `chunk` in `buf` up to `limit` bytes and pass what was kept on; True if cut."""
    room = limit - len(buf)
    if room <= 0:
        return True
    cut = len(chunk) > room
    if cut:
        chunk = chunk[:room]
    buf.extend(chunk)
    if on_output is not None:
        on_output(name, chunk)
    return cut


def write_pending(unregister: Callable[[Fd], Any], fd: Fd, pending: memoryview) -> memoryview:
    """Write to the non-blocking stdin pipe `fd` what it takes now; what is left is returned.

    Once all is written (or the reader has gone), `unregister(fd)` (a selector's, or an event
    loop's `remove_writer`) is called and `fd` closed, and the empty rest is returned: an empty
    result means `fd` is closed."""
    try:
        n = os.write(fd.fileno(), pending[:65536])
        pending = pending[n:]
    except BlockingIOError:
        return pending
    except BrokenPipeError:
        pending = pending[:0]
    if not pending:
        unregister(fd)
        fd.close()
    return pending


def check_request(argv: Sequence[str], cwd: str | None, env: Mapping[str, str] | None,
                  timeout: float | None, output_limit: int) -> None:
    """InvalidRequest for an exec request no runtime path may run (the same rules for all)."""
    if not argv or any(not isinstance(a, str) or "\x00" in a for a in argv):
        raise InvalidRequest("argv must be a non-empty list of strings without NUL")
    if timeout is not None and not timeout > 0:
        raise InvalidRequest(f"timeout must be positive, not {timeout}")
    if output_limit < 0:
        raise InvalidRequest(f"output_limit must be >= 0, not {output_limit}")
    if cwd and (not cwd.startswith("/") or "\x00" in cwd):
        raise InvalidRequest(f"cwd must be an absolute path: {cwd!r}")
    for k, v in (env or {}).items():
        if not k or "=" in k or "\x00" in k or "\x00" in v:
            raise InvalidRequest(f"invalid environment variable {k!r}")


def runc_message(stderr: str) -> str:
    """runc's error text without the logrus decoration (time=... level=error msg="...")."""
    text = stderr.strip()
    m = re.search(r'msg="((?:[^"\\]|\\.)*)"', text)
    if m:
        return m.group(1).replace('\\"', '"')
    return text


class ExecPump:
    """One `runc exec`: pumps stdin/stdout/stderr, waits for runc, enforces the timeout.

    runc is spawned with /dev/null as stdin/stdout, its stderr on a pipe of its own (runc's
    messages), and our stdin/stdout/stderr pipes as fds 3/4/5 (`--preserve-fds 3`), which the
    busybox sh moves to 0/1/2 before exec'ing tini. runc's own stdio copy therefore only ever
    carries the sh's (empty) stdio: it ends when the command ends, even if a background process
    keeps our pipes open, and runc (the command's parent) reaps it and exits with its status.
    """

    def __init__(self, cmd: list[str], pid_file: Path, stdin: bytes | None,
                 timeout: float | None, limit: int, on_output: OnOutput | None,
                 drain_grace: float, container_id: str, control: ExecControl | None = None) -> None:
        self.cmd, self.pid_file, self.stdin, self.control = cmd, pid_file, stdin, control
        if control is not None:
            control.check(stdin)
        self.timeout, self.limit, self.on_output = timeout, limit, on_output
        self.drain_grace, self.container_id = drain_grace, container_id
        self.buf = {"stdout": bytearray(), "stderr": bytearray()}
        self.runc_err = bytearray()
        self.truncated = False

    def _feed(self, name: str, chunk: bytes) -> None:
        if name == "runc":
            if len(self.runc_err) < 65536:
                self.runc_err.extend(chunk)
            return
        self.truncated |= capture(self.buf[name], self.limit, name, chunk, self.on_output)

    def _spawn(self) -> tuple[int, dict[str, Fd], Fd | None]:
        """posix_spawn runc with its fds wired; returns (pid, {name: read end}, stdin write end).
        Every descriptor made here is closed here unless it is returned (then the caller's)."""
        open_stdin = self.control is not None and self.control.open_stdin
        made: list[Fd] = []
        try:
            pipes = {}
            for name in ("stdout", "stderr", "runc"):
                pipes[name] = Fd.pipe(f"exec {name}")
                made += pipes[name]
            stdin_r = stdin_w = None
            if self.stdin is not None or open_stdin:
                stdin_r, stdin_w = Fd.pipe("exec stdin")
                made += [stdin_r, stdin_w]
            devnull = Fd.open(os.devnull, os.O_RDWR)
            made.append(devnull)
            actions = [
                (os.POSIX_SPAWN_DUP2, devnull.fileno(), 0),
                (os.POSIX_SPAWN_DUP2, devnull.fileno(), 1),
                (os.POSIX_SPAWN_DUP2, pipes["runc"][1].fileno(), 2),
                (os.POSIX_SPAWN_DUP2, (stdin_r or devnull).fileno(), 3),
                (os.POSIX_SPAWN_DUP2, pipes["stdout"][1].fileno(), 4),
                (os.POSIX_SPAWN_DUP2, pipes["stderr"][1].fileno(), 5),
            ]
            try:
                pid = os.posix_spawnp(self.cmd[0], self.cmd, os.environ, file_actions=actions)
            except OSError as e:
                if e.errno == errno.E2BIG:
                    raise InvalidRequest("command line or environment too long") from e
                raise RuntimeFailure(f"cannot start runc: {e}") from e
            keep = [r for r, _ in pipes.values()] + ([stdin_w] if stdin_w is not None else [])
            made = [fd for fd in made if fd not in keep]  # runc holds its own copies of the rest
            return pid, {name: r for name, (r, _) in pipes.items()}, stdin_w
        finally:
            for fd in made:
                fd.close()

    def run(self) -> ExecResult:
        start = time.monotonic()
        try:
            runc_pid, readers, stdin_w = self._spawn()
        except BaseException:
            if self.control is not None:
                self.control._detach()
            raise
        if self.control is not None:
            # an open stdin is the control's from here on: the pump never writes or closes it
            self.control._attach(self, stdin_w if self.control.open_stdin else None)
            if self.control.open_stdin:
                stdin_w = None
        code: int | None = None
        try:
            timed_out, code = self._pump(runc_pid, readers, stdin_w, start)
        finally:
            if self.control is not None:
                self.control._detach()
            for fd in readers.values():
                fd.close()
            if stdin_w is not None:
                stdin_w.close()  # a no-op once the pump wrote it all
            if code is None:  # interrupted: do not leave runc or the command running
                killed = self._kill_tree()
                # runc reaps the killed command itself if left alive a moment; killing runc
                # first would hand the command's zombie to us (we may be a subreaper) and
                # the container's init could never finish exiting.
                if not _wait_pid_exit(runc_pid, 2.0):
                    os.kill(runc_pid, signal.SIGKILL)
                os.waitpid(runc_pid, 0)
                reap(killed)
        duration = time.monotonic() - start
        if self._exec_pid(0) is None and code != 0:
            err = runc_message(self.runc_err.decode(errors="replace"))
            if "stopped container" in err or "does not exist" in err or "not running" in err:
                raise EnvironmentGone(f"environment {self.container_id} is not running: {err}")
            if "chdir to cwd" in err:
                raise InvalidRequest(f"working directory unusable: {err}")
            raise RuntimeFailure(f"runc exec failed: {err}", returncode=code, stderr=err)
        if timed_out:
            code = TIMEOUT_EXIT_CODE
        return ExecResult(int(code), bytes(self.buf["stdout"]), bytes(self.buf["stderr"]),
                          duration, timed_out, self.truncated)

    def _exec_pid(self, wait: float) -> int | None:
        end = time.monotonic() + wait
        while True:
            try:
                text = self.pid_file.read_text().strip()
                if text:
                    return int(text)
            except (OSError, ValueError):
                pass
            if time.monotonic() >= end:
                return None
            time.sleep(0.005)

    def _pump(self, runc_pid: int, readers: dict[str, Fd], stdin_w: Fd | None,
              start: float) -> tuple[bool, int]:
        """Move bytes until runc exited and output drained; returns (timed_out, exit code).
        The descriptors stay the caller's (`write_pending` closes stdin once it is written)."""
        sel = selectors.DefaultSelector()
        names = {}
        for name, fd in readers.items():
            os.set_blocking(fd.fileno(), False)
            sel.register(fd, selectors.EVENT_READ)
            names[fd] = name
        pidfd = Fd(os.pidfd_open(runc_pid), "pidfd of runc exec")
        sel.register(pidfd, selectors.EVENT_READ)
        pending = memoryview(self.stdin or b"")
        if stdin_w is not None:
            if pending:
                os.set_blocking(stdin_w.fileno(), False)
                sel.register(stdin_w, selectors.EVENT_WRITE)
            else:
                stdin_w.close()
        deadline = start + self.timeout if self.timeout is not None else None
        timed_out = False
        code: int | None = None
        exited_at: float | None = None
        try:
            while code is None or any(k.fileobj in names for k in sel.get_map().values()):
                now = time.monotonic()
                if deadline is not None and now >= deadline and code is None:
                    timed_out, deadline = True, None
                    self._kill_tree()
                if exited_at is not None and now - exited_at >= self.drain_grace:
                    break  # a background process holds our pipe: stop waiting for EOF
                wait: float | None = None
                if exited_at is not None:
                    wait = max(0.0, exited_at + self.drain_grace - now)
                if deadline is not None:
                    wait = max(0.0, deadline - now) if wait is None else min(wait, deadline - now)
                for key, _ in sel.select(wait):
                    obj = key.fileobj
                    if obj is pidfd:
                        sel.unregister(pidfd)
                        _, wstatus = os.waitpid(runc_pid, 0)
                        code = os.waitstatus_to_exitcode(wstatus)
                        if code < 0:
                            code = 128 - code
                        exited_at = time.monotonic()
                    elif obj is stdin_w:
                        pending = write_pending(sel.unregister, stdin_w, pending)
                    else:
                        chunk = os.read(key.fd, 65536)
                        if not chunk:
                            sel.unregister(obj)
                            continue
                        self._feed(names[obj], chunk)
        finally:
            sel.close()
            pidfd.close()
        return timed_out, int(code)

    def _signal(self, sig: int, wait: float) -> bool:
        """`ExecControl.signal` on this exec: SIGKILL ends the tree, others go to tini."""
        deadline = time.monotonic() + wait
        while True:
            pid = self._exec_pid(0.25)  # runc writes the pid file once the command is spawned
            if pid is not None:
                break
            if time.monotonic() >= deadline or self.control is None or self.control.ended.is_set():
                return False
        if sig == signal.SIGKILL:
            return bool(self._kill_tree())
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return False
        return True

    def _kill_tree(self) -> list[ProcRef]:
        pid = self._exec_pid(2.0)
        root = ref(pid) if pid is not None else None
        return kill_tree(root) if root is not None else []


def _wait_pid_exit(pid: int, timeout: float) -> bool:
    """Whether our child `pid` exited within `timeout` (it is not reaped)."""
    with Fd(os.pidfd_open(pid), f"pidfd of {pid}") as fd:
        return bool(fdwait.wait([fd.fileno()], timeout))
