"""Exec through the environment's own PID 1, rollstack-execd (native/execd), over a unix socket.

Create binds a listening unix socket at `<env dir>/agent/execd.sock` (dir 0700, socket 0600,
host side only: the container never sees it in its filesystem) and hands it to the container's
init as fd 3 (`runc run --preserve-fds 1`). An exec is one connection: we send the request
(argv, env overrides, cwd) with our stdin/stdout/stderr pipes attached as SCM_RIGHTS, and
execd's per-exec shim forks the command inside the sandbox, so the command inherits PID 1's
namespaces, cgroup, capabilities, seccomp filter, no_new_privileges and rlimits without a
`runc exec`. Output flows through the pipes straight to us (capped and streamed exactly as on the
runc path); the socket carries only the final wait status. The timeout is ours: at the deadline
we send 'K' and the shim, a child subreaper, SIGKILLs the command's whole tree (double-forked
and setsid'd processes included). Closing the connection early (we were interrupted, the node
died) ends the tree the same way.

After a checkpoint (rollstack.run.checkpoint) the listener is execd's own, at the abstract
address `NETNS_ADDRESS` of the environment's network namespace (CRIU dumps and restores it with
the processes): `NetnsAgent(pid)` names it, a connection is made by a short-lived thread that
joins the namespace of PID 1 `pid` (a socket keeps the namespace it was made in), and a peer
other than that PID 1 (SO_PEERCRED) is refused as `AgentUnavailable`.

`AgentUnavailable` (no socket, nobody listening) means "use runc exec": environments created
before the agent existed, or whose init is catatonit, keep working. A shim that dies mid-exec
is a `RuntimeFailure`; the environment's next exec gets a fresh shim.
"""

from __future__ import annotations

import array
import asyncio
import os
import selectors
import signal
import socket
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from rollstack.errors import InvalidRequest, RuntimeFailure
from rollstack.host import libc
from rollstack.host.fd import Fd
from rollstack.run.execpump import (TIMEOUT_EXIT_CODE, ExecControl, ExecResult, OnOutput,
                                     capture, write_pending)

AGENT_DIR = "agent"
SOCKET_NAME = "execd.sock"
KILL_GRACE = 10.0
"""Seconds the shim gets to end a timed-out tree and report before we give up on it."""
_MAX_REPLY = 65536
_ASYNC_MAX_REQUEST = 32768
"""Largest request `run_async` sends from the loop (a fresh unix socket buffers ~200 KiB)."""
_BACKLOG = 512
NETNS_ADDRESS = b"\0rollstack-execd"
"""execd's listener after a checkpoint: abstract, in the environment's network namespace."""


class AgentUnavailable(Exception):
    """Nobody serves the environment's exec socket: run the command through runc instead."""


class AgentBusy(Exception):
    """The exec socket's backlog is full (a non-blocking connect): run the exec in a thread."""


def socket_path(env_dir: Path) -> Path:
    return Path(env_dir) / AGENT_DIR / SOCKET_NAME


@dataclass(frozen=True)
class NetnsAgent:
    """The exec agent listening inside the environment (after a checkpoint): `pid` is its PID 1's
    host pid, whose network namespace holds `NETNS_ADDRESS`; `cgroup` names the environment's
    cgroup (a line of /proc/PID/cgroup contains it), so a pid reused by another process is never
    taken for PID 1."""

    pid: int
    cgroup: str

    def _netns(self) -> int:
        """An fd of PID 1's network namespace, pinned: the pid is held by a pidfd while its cgroup
        is checked and the namespace opened, and is still that process after."""
        try:
            pidfd = os.pidfd_open(self.pid)
        except OSError as e:
            raise AgentUnavailable(f"no process {self.pid}: {e}") from e
        try:
            with open(f"/proc/{self.pid}/cgroup") as f:
                if not any(line.rstrip("\n").endswith(self.cgroup) for line in f):
                    raise AgentUnavailable(f"pid {self.pid} is not the environment's init")
            nsfd = os.open(f"/proc/{self.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                signal.pidfd_send_signal(pidfd, 0)  # alive still: the reads above were its own
            except OSError:
                os.close(nsfd)
                raise
            return nsfd
        except OSError as e:
            raise AgentUnavailable(f"no network namespace of pid {self.pid}: {e}") from e
        finally:
            os.close(pidfd)

    def socket(self, flags: int) -> socket.socket:
        """A unix socket made in PID 1's network namespace (by a thread that joins it and ends);
        AgentUnavailable when that namespace cannot be joined (PID 1 is gone)."""
        nsfd = self._netns()
        made: list[socket.socket | BaseException] = []

        def make() -> None:
            try:
                err = libc.setns(nsfd, libc.CLONE_NEWNET)
                if err:
                    raise OSError(err, os.strerror(err))
                made.append(socket.socket(socket.AF_UNIX, flags))
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                made.append(e)

        try:
            worker = threading.Thread(target=make, name="agent-netns", daemon=True)
            worker.start()
            worker.join()
        except RuntimeError as e:  # no thread to be had (the node's pid limit): runc exec then
            raise AgentUnavailable(f"no thread to join the network namespace of pid {self.pid}: {e}") from e
        finally:
            os.close(nsfd)
        if isinstance(made[0], BaseException):
            raise AgentUnavailable(f"joining the network namespace of pid {self.pid}: {made[0]}") from made[0]
        return made[0]

    def check_peer(self, conn: socket.socket) -> None:
        """AgentUnavailable unless the listener `conn` reached is PID 1's own."""
        pid, _, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if pid != self.pid:
            raise AgentUnavailable(f"the exec address is held by pid {pid}, not the environment's init {self.pid}")


AgentAddress = Path | NetnsAgent
"""Where an environment's exec agent listens: the node's socket file, or inside the environment."""


def _short(path: Path, fn: Callable[[str], None]) -> None:
    """Call `fn` with `path`, or with /proc/self/fd/N/NAME when it exceeds sun_path (108)."""
    if len(os.fsencode(path)) < 100:
        fn(str(path))
        return
    dfd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fn(f"/proc/self/fd/{dfd}/{path.name}")
    finally:
        os.close(dfd)


def bind_listener(env_dir: Path) -> socket.socket:
    """The listening socket the environment's init will serve (the caller closes its copy)."""
    path = socket_path(env_dir)
    path.parent.mkdir(mode=0o700)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        _short(path, sock.bind)
        os.chmod(path, 0o600)
        sock.listen(_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def encode_request(argv: Sequence[str], cwd: str | None, env: Mapping[str, str] | None) -> bytes:
    """Header + body of one exec request (see native/execd/execd.c)."""
    parts = [b"a" + os.fsencode(a) + b"\0" for a in argv]
    parts += [b"e" + os.fsencode(f"{k}={v}") + b"\0" for k, v in (env or {}).items()]
    if cwd:
        parts.append(b"c" + os.fsencode(cwd) + b"\0")
    body = b"".join(parts)
    return b"RSX1" + struct.pack("<I", len(body)) + body


def parse_replies(buf: bytearray) -> list[tuple[str, bytes]]:
    """Complete replies at the front of `buf` (consumed); RuntimeFailure on garbage."""
    out = []
    while len(buf) >= 5:
        tag = chr(buf[0])
        (size,) = struct.unpack_from("<I", buf, 1)
        if tag not in "XE" or size > _MAX_REPLY or (tag == "X" and size != 4):
            raise RuntimeFailure(f"exec agent sent a malformed reply (tag {tag!r}, {size} bytes)")
        if len(buf) < 5 + size:
            break
        out.append((tag, bytes(buf[5:5 + size])))
        del buf[:5 + size]
    return out


def exit_code(wstatus: int) -> int:
    """A wait status -> our exit code convention (128+N for signal N)."""
    code = os.waitstatus_to_exitcode(wstatus)
    return 128 - code if code < 0 else code


class AgentPump:
    """One exec over the agent socket: connect, send, pump pipes, wait for the status."""

    def __init__(self, address: AgentAddress, argv: Sequence[str], cwd: str | None,
                 env: Mapping[str, str] | None, stdin: bytes | None, timeout: float | None,
                 limit: int, on_output: OnOutput | None, drain_grace: float,
                 container_id: str, control: ExecControl | None = None) -> None:
        if control is not None:
            control.check(stdin)
        self.address, self.request = address, encode_request(argv, cwd, env)
        self.stdin, self.timeout, self.limit = stdin, timeout, limit
        self.on_output, self.drain_grace, self.container_id = on_output, drain_grace, container_id
        self.control = control
        self.buf = {"stdout": bytearray(), "stderr": bytearray()}
        self.truncated = False
        self._conn: socket.socket | None = None  # while a control may signal through it
        self._ctl_lock = threading.Lock()

    def _connect(self, blocking: bool = True) -> socket.socket:
        flags = socket.SOCK_STREAM | socket.SOCK_CLOEXEC | (0 if blocking else socket.SOCK_NONBLOCK)
        address = self.address
        conn = address.socket(flags) if isinstance(address, NetnsAgent) else socket.socket(socket.AF_UNIX, flags)
        try:
            if isinstance(address, NetnsAgent):
                conn.connect(NETNS_ADDRESS)
                address.check_peer(conn)
            else:
                _short(address, conn.connect)
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError) as e:
            conn.close()
            raise AgentUnavailable(str(e)) from e
        except BlockingIOError as e:  # non-blocking only: the listener's backlog is full
            conn.close()
            raise AgentBusy(str(e)) from e
        except BaseException:
            conn.close()
            raise
        return conn

    def run(self) -> ExecResult:
        """The exec, blocking. With a control, its open stdin and signals go through this
        connection from other threads while it runs (AgentUnavailable leaves it unattached,
        for the runc path to attach)."""
        start = time.monotonic()
        conn = self._connect()
        self._conn = conn
        readers: dict[Fd, str] = {}
        stdin_w: Fd | None = None
        try:
            readers, stdin_w = self._start(conn)
            if self.control is not None:
                # an open stdin is the control's from here on: the pump never writes or closes it
                self.control._attach(self, stdin_w if self.control.open_stdin else None)
                if self.control.open_stdin:
                    stdin_w = None
            try:
                wstatus, timed_out = self._pump(conn, readers, stdin_w, start)
            except BaseException:
                _kill_and_wait(conn)  # the command is gone before the caller sees the error
                raise
        finally:
            if self.control is not None:
                self.control._detach()
            with self._ctl_lock:  # no signal is sent on a closed socket
                self._conn = None
                conn.close()  # before the command ended: the shim kills its tree
            _close_all(readers, stdin_w)
        return self._result(wstatus, timed_out, start)

    def _signal(self, sig: int, wait: float) -> bool:
        """`ExecControl.signal` on this exec: 'K' (the whole tree) for SIGKILL, else 'S' signo
        for the command's process group. False once the exec is over."""
        with self._ctl_lock:
            conn = self._conn
            if conn is None:
                return False
            try:
                msg = b"K" if sig == signal.SIGKILL else b"S" + bytes([sig])  # a signal fits a byte
                conn.send(msg, socket.MSG_DONTWAIT)
            except OSError:  # the shim hung up (the exec is ending) or its buffer is full
                return False
            return True

    def _exec_pid(self, wait: float) -> int | None:
        """The command's host pid is not reported over the agent protocol."""
        return None

    async def run_async(self) -> ExecResult:
        """`run` on the caller's event loop, without a worker thread: the same protocol, limits,
        timeout and errors. `AgentBusy` (before anything was sent) when the socket's backlog is
        full: the caller runs `run` in a thread instead, so a stuck agent never blocks the loop.
        A cancelled caller (its client went away) ends the command's tree, as `run` does."""
        if len(self.request) > _ASYNC_MAX_REQUEST:  # may not fit the socket buffer at once
            raise AgentBusy(f"a {len(self.request)}-byte request is sent from a thread")
        if isinstance(self.address, NetnsAgent):  # its connect joins a namespace in a thread
            raise AgentBusy("an agent inside the environment is reached from a thread")
        loop = asyncio.get_running_loop()
        start = time.monotonic()
        conn = self._connect(blocking=False)
        readers: dict[Fd, str] = {}
        stdin_w: Fd | None = None
        try:
            readers, stdin_w = self._start(conn)
            try:
                wstatus, timed_out = await _LoopPump(self, loop, conn, readers, stdin_w, start).wait()
            except BaseException:
                await _kill_and_wait_async(loop, conn)
                raise
        finally:
            conn.close()
            _close_all(readers, stdin_w)  # after the loop stopped watching them (_LoopPump.wait)
        return self._result(wstatus, timed_out, start)

    def _start(self, conn: socket.socket) -> tuple[dict[Fd, str], Fd | None]:
        """Pipes made, the request sent with the command's ends, our copies of those closed:
        ({read end: stream name}, stdin write end or None), both the caller's to close.
        On an error every descriptor made here is closed here."""
        made: list[Fd] = []
        try:
            out_r, out_w = Fd.pipe("exec stdout")
            made += [out_r, out_w]
            err_r, err_w = Fd.pipe("exec stderr")
            made += [err_r, err_w]
            in_w = None
            if self.stdin is not None or (self.control is not None and self.control.open_stdin):
                in_r, in_w = Fd.pipe("exec stdin")
                made += [in_r, in_w]
            else:
                in_r = Fd.open(os.devnull, os.O_RDONLY)
                made.append(in_r)
            self._send(conn, [in_r.fileno(), out_w.fileno(), err_w.fileno()])
        except BaseException:
            for fd in made:
                fd.close()
            raise
        for fd in (in_r, out_w, err_w):  # the command holds its own copies now
            fd.close()
        return {out_r: "stdout", err_r: "stderr"}, in_w

    def _result(self, wstatus: int, timed_out: bool, start: float) -> ExecResult:
        code = TIMEOUT_EXIT_CODE if timed_out else exit_code(wstatus)
        return ExecResult(code, bytes(self.buf["stdout"]), bytes(self.buf["stderr"]),
                          time.monotonic() - start, timed_out, self.truncated)

    def _send(self, conn: socket.socket, fds: list[int]) -> None:
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        try:
            sent = conn.sendmsg([self.request], rights)
            if sent < len(self.request):
                conn.sendall(self.request[sent:])
        except (BrokenPipeError, ConnectionResetError) as e:
            raise RuntimeFailure(f"exec agent of {self.container_id} hung up: {e}") from e
        except BlockingIOError as e:  # non-blocking only; the shim never got a whole request
            raise AgentBusy(f"exec socket of {self.container_id} is full: {e}") from e

    def _pump(self, conn: socket.socket, readers: dict[Fd, str], stdin_w: Fd | None,
              start: float) -> tuple[int, bool]:
        """Move bytes until the status arrived, output drained and the shim hung up (bounded by
        the drain grace); (wait status, timed out).
        The descriptors stay the caller's (`write_pending` closes stdin once it is written)."""
        sel = selectors.DefaultSelector()
        try:
            for fd in readers:
                os.set_blocking(fd.fileno(), False)
                sel.register(fd, selectors.EVENT_READ)
            conn.setblocking(False)
            sel.register(conn, selectors.EVENT_READ)
            pending = memoryview(self.stdin or b"")
            if stdin_w is not None:
                os.set_blocking(stdin_w.fileno(), False)
                sel.register(stdin_w, selectors.EVENT_WRITE)
            deadline = start + self.timeout if self.timeout is not None else None
            replies, status, ended_at, timed_out = bytearray(), None, None, False
            # done once the status came, the output drained and the shim hung up (it has exited:
            # a checkpoint right after must not find its socket to the node, which CRIU refuses)
            while status is None or any(k.fileobj in readers or k.fileobj is conn
                                        for k in sel.get_map().values()):
                now = time.monotonic()
                if deadline is not None and now >= deadline and status is None:
                    if not timed_out:
                        timed_out, deadline = True, now + KILL_GRACE
                        _send_kill(conn)
                    else:
                        raise RuntimeFailure(f"exec agent of {self.container_id} did not end a "
                                             f"timed-out command within {KILL_GRACE}s")
                if ended_at is not None and now - ended_at >= self.drain_grace:
                    break  # a background process holds our pipe: stop waiting for EOF
                wait = None if ended_at is None else max(0.0, ended_at + self.drain_grace - now)
                if deadline is not None and status is None:
                    left = max(0.0, deadline - now)
                    wait = left if wait is None else min(wait, left)
                for key, _ in sel.select(wait):
                    obj = key.fileobj
                    if obj is conn:
                        status = self._on_reply(conn, sel, replies, status)
                        if status is not None and ended_at is None:
                            ended_at = time.monotonic()
                    elif obj is stdin_w:
                        pending = write_pending(sel.unregister, stdin_w, pending)
                    else:
                        chunk = os.read(key.fd, 65536)
                        if not chunk:
                            sel.unregister(obj)
                            continue
                        name = readers[obj]  # type: ignore[index]
                        self.truncated |= capture(self.buf[name], self.limit, name, chunk,
                                                  self.on_output)
            return int(status), timed_out
        finally:
            sel.close()

    def _on_reply(self, conn: socket.socket, sel: selectors.BaseSelector, replies: bytearray,
                  status: int | None) -> int | None:
        status, closed = self._read_reply(conn, replies, status)
        if closed:
            sel.unregister(conn)
        return status

    def _read_reply(self, conn: socket.socket, replies: bytearray,
                    status: int | None) -> tuple[int | None, bool]:
        """Read what the shim sent: (wait status once known, the connection closed)."""
        try:
            data = conn.recv(65536)
        except BlockingIOError:
            return status, False
        except ConnectionResetError:
            data = b""
        if not data:
            if status is None:
                raise RuntimeFailure(f"exec agent of {self.container_id} closed the connection "
                                     "without a result (its shim died)")
            return status, True
        replies.extend(data)
        for tag, payload in parse_replies(replies):
            if tag == "E":
                msg = payload.decode(errors="replace")
                if msg.startswith("chdir to cwd"):
                    raise InvalidRequest(f"working directory unusable: {msg}")
                if msg.startswith("E2BIG"):
                    raise InvalidRequest("command line or environment too long")
                raise RuntimeFailure(f"exec agent of {self.container_id}: {msg}", stderr=msg)
            (status,) = struct.unpack("<i", payload)
        return status, False


class _LoopPump:
    """`AgentPump._pump` as event-loop callbacks: the pipes and the reply socket are watched by
    the running loop (`add_reader`), the deadline and the drain grace are loop timers. The
    descriptors stay `run_async`'s; every watch on them is removed (`_stop`) before it closes
    them, so the loop's epoll never holds a closed (or reused) number."""

    def __init__(self, pump: AgentPump, loop: asyncio.AbstractEventLoop, conn: socket.socket,
                 readers: dict[Fd, str], stdin_w: Fd | None, start: float) -> None:
        self.pump, self.loop, self.conn, self.readers = pump, loop, conn, readers
        self.open = set(readers)
        self.stdin_w, self.pending = stdin_w, memoryview(pump.stdin or b"")
        self.replies, self.status, self.timed_out = bytearray(), None, False
        self.conn_open = True
        self.done: asyncio.Future[tuple[int, bool]] = loop.create_future()
        self.timers: list[asyncio.TimerHandle] = []
        for fd in readers:
            os.set_blocking(fd.fileno(), False)
            loop.add_reader(fd, self._guard, self._read, fd)
        loop.add_reader(conn, self._guard, self._reply)
        if stdin_w is not None:
            os.set_blocking(stdin_w.fileno(), False)
            loop.add_writer(stdin_w, self._guard, self._write)
        if pump.timeout is not None:
            self.timers.append(loop.call_at(loop.time() + max(0.0, start + pump.timeout - time.monotonic()),
                                            self._guard, self._expire))

    async def wait(self) -> tuple[int, bool]:
        try:
            return await self.done
        finally:
            self._stop()

    def _guard(self, fn: Callable[..., None], *args: object) -> None:
        """Run a callback; its exception ends the exec (never the loop's handler)."""
        if self.done.done():
            return
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting exec
            self._finish(exc=e)

    def _read(self, fd: Fd) -> None:
        try:
            chunk = os.read(fd.fileno(), 65536)
        except BlockingIOError:
            return
        if not chunk:
            self.loop.remove_reader(fd)
            self.open.discard(fd)
            self._check_done()
            return
        name = self.readers[fd]
        self.pump.truncated |= capture(self.pump.buf[name], self.pump.limit, name, chunk,
                                       self.pump.on_output)

    def _reply(self) -> None:
        known = self.status is not None
        self.status, closed = self.pump._read_reply(self.conn, self.replies, self.status)
        if closed:
            self.loop.remove_reader(self.conn)
            self.conn_open = False
        if self.status is not None and not known:  # output may still be draining: a grace
            self.timers.append(self.loop.call_later(self.pump.drain_grace, self._guard, self._finish))
        self._check_done()

    def _write(self) -> None:
        assert self.stdin_w is not None
        self.pending = write_pending(self.loop.remove_writer, self.stdin_w, self.pending)
        if not self.pending:
            self.stdin_w = None  # removed from the loop and closed

    def _expire(self) -> None:
        if self.status is not None:
            return
        if not self.timed_out:  # kill the tree; the shim reports, or hangs up, within the grace
            self.timed_out = True
            _send_kill(self.conn)
            self.timers.append(self.loop.call_later(KILL_GRACE, self._guard, self._expire))
            return
        raise RuntimeFailure(f"exec agent of {self.pump.container_id} did not end a "
                             f"timed-out command within {KILL_GRACE}s")

    def _check_done(self) -> None:
        if self.status is not None and not self.open and not self.conn_open:  # as `_pump`
            self._finish()

    def _finish(self, exc: BaseException | None = None) -> None:
        if self.done.done():
            return
        if exc is not None:
            self.done.set_exception(exc)
        else:
            self.done.set_result((int(self.status), self.timed_out))  # type: ignore[arg-type]

    def _stop(self) -> None:
        for t in self.timers:
            t.cancel()
        for fd in self.open:
            self.loop.remove_reader(fd)
        self.open.clear()
        if self.conn_open:
            self.loop.remove_reader(self.conn)
            self.conn_open = False
        if self.stdin_w is not None:
            self.loop.remove_writer(self.stdin_w)
            self.stdin_w = None  # closed by run_async


async def _kill_and_wait_async(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
    """`_kill_and_wait` without blocking the loop (also after our caller was cancelled)."""
    _send_kill(conn)
    try:
        async with asyncio.timeout(KILL_GRACE):
            while await loop.sock_recv(conn, 65536):
                pass
    except (OSError, TimeoutError, asyncio.CancelledError):
        pass  # gone already, the grace ran out, or cancelled again: the close still kills it


def _kill_and_wait(conn: socket.socket) -> None:
    """An exec that failed on our side (an output callback raised, an interrupt): kill the
    command's tree and wait, at most KILL_GRACE, until the shim reports or hangs up, so the
    next exec never sees it still running (seen in CI: `ps` right after still listed it)."""
    try:
        conn.setblocking(True)
        conn.settimeout(KILL_GRACE)
        _send_kill(conn)
        while conn.recv(65536):
            pass
    except OSError:
        pass  # gone already, or the grace ran out: the close that follows still kills it


def _send_kill(conn: socket.socket) -> None:
    try:
        conn.send(b"K")
    except (BlockingIOError, BrokenPipeError, ConnectionResetError):
        pass  # the shim is gone or ending: its reply (or EOF) says which


def _close_all(readers: Mapping[Fd, str], stdin_w: Fd | None) -> None:
    for fd in readers:
        fd.close()
    if stdin_w is not None:
        stdin_w.close()  # a no-op once the pump wrote it all
