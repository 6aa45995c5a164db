"""A blocking wrapper around the `runc` binary (called from worker threads, never an event loop).

Exec and its process tree: every command runs as

    runc exec --preserve-fds 3 ID /.rollstack/busybox sh -c \
        'exec 0<&3 1>&4 2>&5 3<&- 4>&- 5>&-; exec "$@"' rollstack-exec \
        /.rollstack/tini -s -g -- ARGV...

Our stdin/stdout/stderr pipes travel as runc's preserved fds 3/4/5 and the static busybox sh
moves them to 0/1/2 before becoming tini. So runc's own stdio copying (which a non-detached runc
always does) only carries the sh's empty stdio and ends with the command, even when a background
process keeps our pipes open; runc stays the command's parent, reaps it and exits with its
status (a detached exec would orphan the command to the host's init, leaving zombies on hosts
whose init does not reap). tini puts the command in its own process group and, as a child
subreaper, inherits every orphan of the tree (even double-forked daemons), so while it lives
"the exec's tree" is exactly its descendants. On timeout we SIGSTOP that tree until it stops
growing, SIGKILL all of it, and report `timed_out=True` with `exit_code=124` (coreutils
`timeout`'s convention). A command killed by signal N exits 128+N.

Output: stdout and stderr are captured separately, each up to `output_limit` bytes (default
16 MiB); the rest is read and dropped (so the command never blocks on a full pipe) and
`truncated=True`. `on_output(stream, chunk)` sees the same bytes as they arrive. A background
process that keeps the exec's stdout/stderr open does not hold the exec: once the command has
exited we read for `drain_grace` seconds more (default 0.2 s) and return.

Failures of runc itself become `RuntimeFailure` carrying runc's stderr; an exec into a container
that is not running is `EnvironmentGone`.
"""

from __future__ import annotations

import json
import os
import re
import select
import selectors
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from rollstack.errors import EnvironmentGone, InvalidRequest, RuntimeFailure
from rollstack.run.ocispec import EXEC_WRAPPER_PATH, SHELL_PATH, cpu_quota
from rollstack.run.procs import ProcRef, kill_tree, reap, ref

DEFAULT_OUTPUT_LIMIT = 16 * 1024 * 1024
TIMEOUT_EXIT_CODE = 124
# Moves our pipes (runc's preserved fds 3/4/5) to stdio, then becomes tini.
FD_SCRIPT = 'exec 0<&3 1>&4 2>&5 3<&- 4>&- 5>&-; exec "$@"'
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


@dataclass(frozen=True)
class ContainerState:
    id: str
    status: str  # created | running | stopped | paused
    pid: int
    bundle: str


class Runc:
    """runc with a private state root (`runc --root ROOT`)."""

    def __init__(self, root: Path, binary: str = "runc", scratch: Path | None = None) -> None:
        self.root = Path(root)
        self.binary = binary
        # Per-exec pid files live beside runc's state, not in it (runc list would warn).
        self.scratch = Path(scratch) if scratch else self.root.with_name(self.root.name + "-exec")
        self.root.mkdir(parents=True, exist_ok=True)
        self.scratch.mkdir(parents=True, exist_ok=True)

    def _cmd(self, *args: str) -> list[str]:
        return [self.binary, "--root", str(self.root), *args]

    def _run(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[bytes]:
        try:
            proc = subprocess.run(self._cmd(*args), stdin=subprocess.DEVNULL,
                                  capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise RuntimeFailure(f"runc {args[0]} timed out after {timeout}s") from e
        except FileNotFoundError as e:
            raise RuntimeFailure(f"runc binary not found: {self.binary}") from e
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace").strip()
            raise RuntimeFailure(f"runc {args[0]} failed: {_message(err)}",
                                 returncode=proc.returncode, stderr=err)
        return proc

    # -- lifecycle ---------------------------------------------------------------------------

    def run_detached(self, container_id: str, bundle: Path, log: Path | None = None,
                     timeout: float = 60.0) -> int:
        """`runc run -d`: start the container's init; returns its host pid.

        The container's stdio is /dev/null (it must not hold a pipe of ours); runc's own
        messages go to `log` (default `<bundle>/runc.log`) and into the error on failure.
        """
        log = Path(log or Path(bundle) / "runc.log")
        pid_file = Path(bundle) / "init.pid"
        pid_file.unlink(missing_ok=True)
        cmd = [self.binary, "--root", str(self.root), "--log", str(log), "run", "-d",
               "--pid-file", str(pid_file), "--bundle", str(bundle), container_id]
        try:
            proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise RuntimeFailure(f"runc run {container_id} timed out after {timeout}s") from e
        if proc.returncode != 0:
            try:
                tail = log.read_text(errors="replace")[-4000:]
            except OSError:
                tail = ""
            raise RuntimeFailure(f"runc run {container_id} failed: {_last_error(tail)}",
                                 returncode=proc.returncode, log=tail)
        return int(pid_file.read_text().strip())

    def state(self, container_id: str) -> ContainerState:
        """The container's state; RuntimeFailure if runc does not know it."""
        data = json.loads(self._run("state", container_id).stdout)
        return ContainerState(data["id"], data["status"], int(data.get("pid") or 0),
                              data.get("bundle", ""))

    def list(self) -> list[ContainerState]:
        raw = self._run("list", "--format", "json").stdout.strip()
        items = json.loads(raw) if raw and raw != b"null" else []
        return [ContainerState(d["id"], d["status"], int(d.get("pid") or 0), d.get("bundle", ""))
                for d in items or []]

    def kill(self, container_id: str, sig: str = "KILL", all_processes: bool = False) -> None:
        args = ["kill"] + (["--all"] if all_processes else []) + [container_id, sig]
        self._run(*args)

    def delete(self, container_id: str, force: bool = False) -> None:
        self._run("delete", *(["--force"] if force else []), container_id)

    def update(self, container_id: str, cpu: float | None = None, memory: int | None = None,
               pids: int | None = None, cpu_period_us: int = 100_000) -> None:
        """Change quotas live: `cpu` cores, `memory` bytes, `pids`."""
        args: list[str] = []
        if cpu is not None:
            if cpu <= 0:
                raise InvalidRequest(f"cpu must be positive, not {cpu}")
            args += ["--cpu-period", str(cpu_period_us),
                     "--cpu-quota", str(cpu_quota(cpu, cpu_period_us))]
        if memory is not None:
            args += ["--memory", str(int(memory))]
        if pids is not None:
            args += ["--pids-limit", str(int(pids))]
        if args:
            self._run("update", *args, container_id)

    # -- exec --------------------------------------------------------------------------------

    def exec(self, container_id: str, argv: Sequence[str], *, cwd: str | None = None,
             env: Mapping[str, str] | None = None, stdin: bytes | None = None,
             timeout: float | None = None, output_limit: int = DEFAULT_OUTPUT_LIMIT,
             on_output: OnOutput | None = None, drain_grace: float = 0.2) -> ExecResult:
        """Run `argv` in the container (see the module docstring for tree/timeout/output rules)."""
        if not argv or any(not isinstance(a, str) or "\x00" in a for a in argv):
            raise InvalidRequest("argv must be a non-empty list of strings without NUL")
        if timeout is not None and not timeout > 0:
            raise InvalidRequest(f"timeout must be positive, not {timeout}")
        if output_limit < 0:
            raise InvalidRequest(f"output_limit must be >= 0, not {output_limit}")
        args = ["exec", "--preserve-fds", "3"]
        if cwd:
            if not cwd.startswith("/") or "\x00" in cwd:
                raise InvalidRequest(f"cwd must be an absolute path: {cwd!r}")
            args += ["--cwd", cwd]
        for k, v in (env or {}).items():
            if not k or "=" in k or "\x00" in k or "\x00" in v:
                raise InvalidRequest(f"invalid environment variable {k!r}")
            args += ["--env", f"{k}={v}"]
        with tempfile.TemporaryDirectory(prefix=f"{container_id}.", dir=self.scratch) as tmp:
            pid_file = Path(tmp) / "pid"
            args += ["--pid-file", str(pid_file), container_id,
                     SHELL_PATH, "sh", "-c", FD_SCRIPT, "rollstack-exec",
                     EXEC_WRAPPER_PATH, "-s", "-g", "--", *argv]
            return _Exec(self._cmd(*args), pid_file, stdin, timeout, output_limit, on_output,
                         drain_grace, container_id).run()


def _message(stderr: str) -> str:
    """runc's error text without the logrus decoration (time=... level=error msg="...")."""
    text = stderr.strip()
    m = re.search(r'msg="((?:[^"\\]|\\.)*)"', text)
    if m:
        return m.group(1).replace('\\"', '"')
    return text


def _last_error(log_tail: str) -> str:
    """The message of runc's last error log line (text or json format)."""
    for line in reversed(log_tail.splitlines()):
        line = line.strip()
        if not line:
            continue
        try:
            rec: Any = json.loads(line)
            if isinstance(rec, dict) and rec.get("level") in ("error", "fatal"):
                return str(rec.get("msg", line))
        except ValueError:
            if "level=error" in line or "level=fatal" in line or "error" in line.lower():
                return _message(line)
    return log_tail.strip()[-500:]


class _Exec:
    """One `runc exec`: pumps stdin/stdout/stderr, waits for runc, enforces the timeout.

    runc is spawned with /dev/null as stdin/stdout, its stderr on a pipe of its own (runc's
    messages), and our stdin/stdout/stderr pipes as fds 3/4/5 (`--preserve-fds 3`), which the
    busybox sh moves to 0/1/2 before exec'ing tini. runc's own stdio copy therefore only ever
    carries the sh's (empty) stdio: it ends when the command ends, even if a background process
    keeps our pipes open, and runc (the command's parent) reaps it and exits with its status.
    """

    def __init__(self, cmd: list[str], pid_file: Path, stdin: bytes | None,
                 timeout: float | None, limit: int, on_output: OnOutput | None,
                 drain_grace: float, container_id: str) -> None:
        self.cmd, self.pid_file, self.stdin = cmd, pid_file, stdin
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
        buf = self.buf[name]
        room = self.limit - len(buf)
        if room <= 0:
            self.truncated = True
            return
        if len(chunk) > room:
            chunk, self.truncated = chunk[:room], True
        buf.extend(chunk)
        if self.on_output is not None:
            self.on_output(name, chunk)

    def _spawn(self) -> tuple[int, dict[str, int], int]:
        """posix_spawn runc with its fds wired; returns (pid, {name: read fd}, stdin write fd)."""
        pipes = {name: os.pipe() for name in ("stdout", "stderr", "runc")}
        stdin_r, stdin_w = os.pipe() if self.stdin is not None else (-1, -1)
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            actions = [
                (os.POSIX_SPAWN_DUP2, devnull, 0),
                (os.POSIX_SPAWN_DUP2, devnull, 1),
                (os.POSIX_SPAWN_DUP2, pipes["runc"][1], 2),
                (os.POSIX_SPAWN_DUP2, stdin_r if stdin_r >= 0 else devnull, 3),
                (os.POSIX_SPAWN_DUP2, pipes["stdout"][1], 4),
                (os.POSIX_SPAWN_DUP2, pipes["stderr"][1], 5),
            ]
            try:
                pid = os.posix_spawnp(self.cmd[0], self.cmd, os.environ, file_actions=actions)
            except OSError as e:
                for r, _ in pipes.values():
                    os.close(r)
                if stdin_w >= 0:
                    os.close(stdin_w)
                raise RuntimeFailure(f"cannot start runc: {e}") from e
        finally:
            os.close(devnull)
            for _, w in pipes.values():
                os.close(w)
            if stdin_r >= 0:
                os.close(stdin_r)
        return pid, {name: r for name, (r, _) in pipes.items()}, stdin_w

    def run(self) -> ExecResult:
        start = time.monotonic()
        runc_pid, readers, stdin_w = self._spawn()
        code: int | None = None
        try:
            timed_out, code = self._pump(runc_pid, readers, stdin_w, start)
        finally:
            for fd in readers.values():
                _close(fd)
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
            err = _message(self.runc_err.decode(errors="replace"))
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

    def _pump(self, runc_pid: int, readers: dict[str, int], stdin_w: int,
              start: float) -> tuple[bool, int]:
        """Move bytes until runc exited and output drained; returns (timed_out, exit code)."""
        sel = selectors.DefaultSelector()
        names = {}
        for name, fd in readers.items():
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
            names[fd] = name
        pidfd = os.pidfd_open(runc_pid)
        sel.register(pidfd, selectors.EVENT_READ)
        pending = memoryview(self.stdin or b"")
        if stdin_w >= 0:
            if pending:
                os.set_blocking(stdin_w, False)
                sel.register(stdin_w, selectors.EVENT_WRITE)
            else:
                os.close(stdin_w)
                stdin_w = -1
        deadline = start + self.timeout if self.timeout is not None else None
        timed_out = False
        code: int | None = None
        exited_at: float | None = None
        try:
            while code is None or any(k.fd in names for k in sel.get_map().values()):
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
                    fd = key.fd
                    if fd == pidfd:
                        sel.unregister(pidfd)
                        _, wstatus = os.waitpid(runc_pid, 0)
                        code = os.waitstatus_to_exitcode(wstatus)
                        if code < 0:
                            code = 128 - code
                        exited_at = time.monotonic()
                    elif fd == stdin_w:
                        try:
                            n = os.write(fd, pending[:65536])
                            pending = pending[n:]
                        except BlockingIOError:
                            continue
                        except BrokenPipeError:
                            pending = pending[:0]
                        if not pending:
                            sel.unregister(fd)
                            os.close(fd)
                            stdin_w = -1
                    else:
                        chunk = os.read(fd, 65536)
                        if not chunk:
                            sel.unregister(fd)
                            continue
                        self._feed(names[fd], chunk)
        finally:
            if stdin_w >= 0:
                _close(stdin_w)
            os.close(pidfd)
            sel.close()
        return timed_out, int(code)

    def _kill_tree(self) -> list[ProcRef]:
        pid = self._exec_pid(2.0)
        root = ref(pid) if pid is not None else None
        return kill_tree(root) if root is not None else []


def _wait_pid_exit(pid: int, timeout: float) -> bool:
    """Whether our child `pid` exited within `timeout` (it is not reaped)."""
    fd = os.pidfd_open(pid)
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
