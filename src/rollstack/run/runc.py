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

import fcntl
import json
import os
import signal
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from rollstack.errors import InvalidRequest, RuntimeFailure
from rollstack.host import fdwait
from rollstack.host.fd import Fd
from rollstack.run.execpump import (
    DEFAULT_OUTPUT_LIMIT, TIMEOUT_EXIT_CODE, ExecControl, ExecPump, ExecResult, OnOutput, check_request,
    runc_message,
)
from rollstack.run.ocispec import EXEC_WRAPPER_PATH, SHELL_PATH, cpu_quota

__all__ = ["ContainerState", "DEFAULT_OUTPUT_LIMIT", "ExecResult", "OnOutput", "Runc",
           "TIMEOUT_EXIT_CODE"]

# Moves our pipes (runc's preserved fds 3/4/5) to stdio, then becomes tini.
FD_SCRIPT = 'exec 0<&3 1>&4 2>&5 3<&- 4>&- 5>&-; exec "$@"'


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
                     timeout: float = 60.0, listen_fd: int | None = None, new_keyring: bool = True) -> int:
        """`runc run -d`: start the container's init; returns its host pid.

        The container's stdio is /dev/null (it must not hold a pipe of ours); runc's own
        messages go to `log` (default `<bundle>/runc.log`) and into the error on failure.
        `listen_fd` (the exec agent's listening socket) becomes the init's fd 3.
        `new_keyring=False` (`--no-new-keyring`): no session keyring of its own. A keyring is
        charged to the container root's host uid, and user-namespaced environments all map
        root to one uid (100000), whose quota (`kernel.keys.maxkeys`, 200 by default) then
        caps live environments; only safe when the container cannot use keyrings at all
        (seccomp denies add_key/keyctl/request_key, /proc/keys is masked).
        """
        log = Path(log or Path(bundle) / "runc.log")
        pid_file = Path(bundle) / "init.pid"
        pid_file.unlink(missing_ok=True)
        cmd = [self.binary, "--root", str(self.root), "--log", str(log), "run", "-d",
               *(["--preserve-fds", "1"] if listen_fd is not None else []),
               *([] if new_keyring else ["--no-new-keyring"]),
               "--pid-file", str(pid_file), "--bundle", str(bundle), container_id]
        try:
            returncode = _spawn_wait(cmd, listen_fd, timeout)
        except subprocess.TimeoutExpired as e:
            raise RuntimeFailure(f"runc run {container_id} timed out after {timeout}s") from e
        if returncode != 0:
            try:
                tail = log.read_text(errors="replace")[-4000:]
            except OSError:
                tail = ""
            raise RuntimeFailure(f"runc run {container_id} failed: {_last_error(tail)}",
                                 returncode=returncode, log=tail)
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

    def has_state(self, container_id: str) -> bool:
        """Whether this runtime keeps state for the container (it may have stopped)."""
        return (self.root / container_id).exists()

    def drop_state(self, container_id: str) -> None:
        """Remove the container's state by hand (when `delete --force` itself failed)."""
        import shutil

        shutil.rmtree(self.root / container_id, ignore_errors=True)

    def kill(self, container_id: str, sig: str = "KILL", all_processes: bool = False) -> None:
        args = ["kill"] + (["--all"] if all_processes else []) + [container_id, sig]
        self._run(*args)

    def pause(self, container_id: str) -> None:
        """Freeze every process of the container (the cgroup freezer)."""
        self._run("pause", container_id)

    def resume(self, container_id: str) -> None:
        self._run("resume", container_id)

    def checkpoint(self, container_id: str, images: Path, work: Path, criu: str, timeout: float = 300.0) -> None:
        """`runc checkpoint`: CRIU dumps the container's processes into `images` and runc
        deletes the container (its mounts and network namespace stay the caller's)."""
        self._criu(criu, timeout, work, "dump.log", "checkpoint", "--image-path", str(images),
                   "--work-path", str(work), container_id)

    def restore(self, container_id: str, bundle: Path, images: Path, work: Path, criu: str,
                timeout: float = 300.0) -> int:
        """`runc restore -d` of a checkpoint: the same processes back in a container of the same
        id and bundle; returns its init's host pid (written to `<bundle>/init.pid` as at run)."""
        pid_file = Path(bundle) / "init.pid"
        pid_file.unlink(missing_ok=True)
        self._criu(criu, timeout, work, "restore.log", "restore", "-d", "--image-path", str(images),
                   "--work-path", str(work), "--pid-file", str(pid_file), "--bundle", str(bundle), container_id)
        return int(pid_file.read_text().strip())

    def _criu(self, criu: str, timeout: float, work: Path, log_name: str, *args: str) -> None:
        """runc with `--criu`; a failure names CRIU's own last errors (from its log in `work`)."""
        cmd = [self.binary, "--root", str(self.root), "--criu", criu, *args]
        # a session of its own: a timeout ends runc and its `criu swrk` child together
        with subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True) as child:
            try:
                _, errb = child.communicate(timeout=timeout)
            except subprocess.TimeoutExpired as e:
                os.killpg(child.pid, signal.SIGKILL)
                child.communicate()
                raise RuntimeFailure(f"runc {args[0]} timed out after {timeout}s") from e
        if child.returncode != 0:
            try:
                log = (Path(work) / log_name).read_text(errors="replace")
            except OSError:
                log = ""
            errors = [ln.strip() for ln in log.splitlines() if "Error" in ln][-3:]
            err = errb.decode(errors="replace").strip()
            raise RuntimeFailure(f"runc {args[0]} failed: {'; '.join(errors) or _message(err)}",
                                 returncode=child.returncode, stderr=err[-2000:], criu_log=log[-4000:])

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
             on_output: OnOutput | None = None, drain_grace: float = 0.2,
             control: ExecControl | None = None) -> ExecResult:
        """Run `argv` in the container (see the module docstring for tree/timeout/output rules)."""
        check_request(argv, cwd, env, timeout, output_limit)
        # tini's warnings (e.g. "Child was dead when forwarding signal", when runc forwards a
        # signal after the command ended) would land in the command's stderr: muted. Its fatal
        # errors (a command that cannot be exec'd) still print. The variable is visible to the
        # command; a caller's own TINI_VERBOSITY (set below) wins.
        args = ["exec", "--preserve-fds", "3", "--env", "TINI_VERBOSITY=0"]
        if cwd:
            args += ["--cwd", cwd]
        for k, v in (env or {}).items():
            args += ["--env", f"{k}={v}"]
        pid_file = self.scratch / f"{container_id}.{uuid.uuid4().hex}.pid"
        args += ["--pid-file", str(pid_file), container_id,
                 SHELL_PATH, "sh", "-c", FD_SCRIPT, "rollstack-exec",
                 EXEC_WRAPPER_PATH, "-s", "-g", "--", *argv]
        try:
            return ExecPump(self._cmd(*args), pid_file, stdin, timeout, output_limit, on_output,
                            drain_grace, container_id, control).run()
        finally:
            pid_file.unlink(missing_ok=True)


def _spawn_wait(cmd: list[str], fd3: int | None, timeout: float) -> int:
    """Run `cmd` with /dev/null stdio and `fd3` (if any) as its fd 3; its exit code."""
    if fd3 is None:
        return subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=timeout).returncode
    # dup2(3, 3) would keep fd 3's close-on-exec flag: place it from another number. Both are
    # ours alone and closed once on every path (devnull too when the dup fails).
    with Fd.open(os.devnull, os.O_RDWR) as devnull, \
            Fd(fcntl.fcntl(fd3, fcntl.F_DUPFD_CLOEXEC, 10), "runc fd 3") as src:
        actions = [(os.POSIX_SPAWN_DUP2, devnull.fileno(), i) for i in range(3)]
        actions.append((os.POSIX_SPAWN_DUP2, src.fileno(), 3))
        try:
            pid = os.posix_spawnp(cmd[0], cmd, os.environ, file_actions=actions)
        except OSError as e:
            raise RuntimeFailure(f"cannot start runc: {e}") from e
    pidfd = os.pidfd_open(pid)
    try:
        if not fdwait.wait([pidfd], timeout):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise subprocess.TimeoutExpired(cmd, timeout)
    finally:
        os.close(pidfd)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _message(stderr: str) -> str:
    return runc_message(stderr)


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
