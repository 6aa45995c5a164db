"""A blocking wrapper around the `runc` binary (called from worker threads, never an event loop).

Exec and its process tree: every command runs as `/.rollstack/tini -s -g -- argv`. tini puts the
command in its own process group and, as a child subreaper, inherits every orphan of the tree
(even double-forked daemons), so while it lives "the exec's tree" is exactly tini's descendants.
On timeout we SIGSTOP that tree until it stops growing, SIGKILL all of it, and report
`timed_out=True` with `exit_code=124` (coreutils `timeout`'s convention).

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
import selectors
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from rollstack.errors import EnvironmentGone, InvalidRequest, RuntimeFailure
from rollstack.run.ocispec import EXEC_WRAPPER_PATH, cpu_quota

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


@dataclass(frozen=True)
class ContainerState:
    id: str
    status: str  # created | running | stopped | paused
    pid: int
    bundle: str


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids.extend(int(x) for x in f.read().split())
            except OSError:
                pass
    except OSError:
        pass
    return kids


def descendants(pid: int) -> list[int]:
    """All live descendants of `pid` (host pids), parents before children."""
    out, todo, seen = [], [pid], {pid}
    while todo:
        for kid in _children(todo.pop()):
            if kid not in seen:
                seen.add(kid)
                out.append(kid)
                todo.append(kid)
    return out


def _signal(pids: Sequence[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def kill_tree(root_pid: int, rounds: int = 50) -> None:
    """SIGKILL `root_pid` and every descendant without letting the tree fork away.

    Stop first (a stopped process cannot fork), re-list until no new member appears, then kill
    all. The root is a subreaper, so orphans created meanwhile still show up under it.
    """
    stopped: set[int] = set()
    for _ in range(rounds):
        tree = [root_pid, *descendants(root_pid)]
        new = [p for p in tree if p not in stopped]
        if not new:
            break
        _signal(new, signal.SIGSTOP)
        stopped.update(new)
    _signal(sorted(stopped), signal.SIGKILL)
    _signal(descendants(root_pid), signal.SIGKILL)


class Runc:
    """runc with a private state root (`runc --root ROOT`)."""

    def __init__(self, root: Path, binary: str = "runc") -> None:
        self.root = Path(root)
        self.binary = binary
        self.root.mkdir(parents=True, exist_ok=True)

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
            raise RuntimeFailure(f"runc {args[0]} failed: {err}", returncode=proc.returncode,
                                 stderr=err)
        return proc

    # -- lifecycle ---------------------------------------------------------------------------

    def run_detached(self, container_id: str, bundle: Path, log: Path | None = None) -> int:
        """`runc run -d`: start the container's init; returns its host pid.

        The container's stdio is /dev/null (it must not hold a pipe of ours); runc's own
        messages go to `log` (default `<bundle>/runc.log`) and into the error on failure.
        """
        log = Path(log or Path(bundle) / "runc.log")
        pid_file = Path(bundle) / "init.pid"
        pid_file.unlink(missing_ok=True)
        cmd = [self.binary, "--root", str(self.root), "--log", str(log), "run", "-d",
               "--pid-file", str(pid_file), "--bundle", str(bundle), container_id]
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
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
        """Change quotas live: `cpu` cores, `memory` bytes (swap kept disabled), `pids`."""
        args: list[str] = []
        if cpu is not None:
            if cpu <= 0:
                raise InvalidRequest(f"cpu must be positive, not {cpu}")
            args += ["--cpu-period", str(cpu_period_us),
                     "--cpu-quota", str(cpu_quota(cpu, cpu_period_us))]
        if memory is not None:
            args += ["--memory", str(int(memory)), "--memory-swap", str(int(memory))]
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
        if not argv:
            raise InvalidRequest("empty argv")
        if timeout is not None and timeout <= 0:
            raise InvalidRequest(f"timeout must be positive, not {timeout}")
        args = ["exec"]
        if cwd:
            args += ["--cwd", cwd]
        for k, v in (env or {}).items():
            if not k or "=" in k or "\x00" in k or "\x00" in v:
                raise InvalidRequest(f"invalid environment variable {k!r}")
            args += ["--env", f"{k}={v}"]
        with tempfile.TemporaryDirectory(prefix="rs-exec-", dir=self.root) as tmp:
            pid_file = Path(tmp) / "pid"
            args += ["--pid-file", str(pid_file), container_id,
                     EXEC_WRAPPER_PATH, "-s", "-g", "--", *argv]
            return _Exec(self._cmd(*args), pid_file, stdin, timeout, output_limit, on_output,
                         drain_grace, container_id).run()


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
                return line
    return log_tail.strip()[-500:]


class _Exec:
    """One running `runc exec`: pumps stdin/stdout/stderr, enforces the timeout."""

    def __init__(self, cmd: list[str], pid_file: Path, stdin: bytes | None,
                 timeout: float | None, limit: int, on_output: OnOutput | None,
                 drain_grace: float, container_id: str) -> None:
        self.cmd, self.pid_file, self.stdin = cmd, pid_file, stdin
        self.timeout, self.limit, self.on_output = timeout, limit, on_output
        self.drain_grace, self.container_id = drain_grace, container_id
        self.buf = {"stdout": bytearray(), "stderr": bytearray()}
        self.truncated = False

    def _feed(self, name: str, chunk: bytes) -> None:
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

    def run(self) -> ExecResult:
        start = time.monotonic()
        proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE if self.stdin is not None
                                else subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        try:
            timed_out = self._pump(proc, start)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for f in (proc.stdin, proc.stdout, proc.stderr):
                if f is not None:
                    f.close()
        duration = time.monotonic() - start
        code = proc.returncode
        started = self._exec_pid(0) is not None
        if not started and not timed_out:
            err = bytes(self.buf["stderr"]).decode(errors="replace").strip()
            if "not running" in err or "stopped" in err or "does not exist" in err:
                raise EnvironmentGone(f"environment {self.container_id} is not running: {err}")
            raise RuntimeFailure(f"runc exec failed: {err}", returncode=code, stderr=err)
        if timed_out:
            code = TIMEOUT_EXIT_CODE
        elif code is not None and code < 0:
            code = 128 - code
        return ExecResult(int(code if code is not None else -1), bytes(self.buf["stdout"]),
                          bytes(self.buf["stderr"]), duration, timed_out, self.truncated)

    def _pump(self, proc: subprocess.Popen[bytes], start: float) -> bool:
        sel = selectors.DefaultSelector()
        names = {}
        for name, f in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            assert f is not None
            os.set_blocking(f.fileno(), False)
            sel.register(f.fileno(), selectors.EVENT_READ)
            names[f.fileno()] = name
        pending = memoryview(self.stdin or b"")
        stdin_fd = -1
        if proc.stdin is not None:
            if pending:
                stdin_fd = proc.stdin.fileno()
                os.set_blocking(stdin_fd, False)
                sel.register(stdin_fd, selectors.EVENT_WRITE)
            else:
                proc.stdin.close()
        deadline = start + self.timeout if self.timeout is not None else None
        timed_out = False
        exited_at: float | None = None
        while sel.get_map():
            now = time.monotonic()
            if deadline is not None and now >= deadline and not timed_out:
                timed_out = True
                self._kill_tree(proc)
                deadline = None
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at >= self.drain_grace:
                break
            wait = 0.1 if exited_at is None else max(0.0, exited_at + self.drain_grace - now)
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - now))
            for key, _ in sel.select(wait):
                fd = key.fd
                if fd == stdin_fd:
                    try:
                        n = os.write(fd, pending[:65536])
                        pending = pending[n:]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(fd)
                        stdin_fd = -1
                        assert proc.stdin is not None
                        proc.stdin.close()
                    continue
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(fd)
                    continue
                self._feed(names[fd], chunk)
        sel.close()
        return timed_out

    def _kill_tree(self, proc: subprocess.Popen[bytes]) -> None:
        pid = self._exec_pid(2.0)
        if pid is not None:
            kill_tree(pid)
        else:  # runc never started the command: stop runc itself
            proc.kill()
