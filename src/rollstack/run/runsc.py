"""The gVisor tier: `runsc` behind the same interface as `rollstack.run.runc.Runc`.

The environment's OCI spec is the same one runc gets; runsc runs it in a gVisor sandbox (its
own kernel in user space: the environment's syscalls are served by the Sentry, not the host).
Differences from runc, all handled here:

- platform: `--platform=ptrace` by default (works without KVM/nested virtualisation);
- network: `--network=none` (loopback only, like runc's fresh netns) unless the spec joins a
  network namespace (a network policy, rollstack.run.network): then `--network=sandbox`, and
  gVisor's own netstack takes the netns's eth0 over (it moves the address and routes of the
  netns into the Sentry; the host side, veth and nftables table, is unchanged). Debian's runsc
  (20221219) decides "am I in the root netns?" by whether /proc/sys/net/core/rmem_default is
  accessible, which kernels >= 6 make true in every netns, so `runsc run` runs in a private
  mount namespace whose /proc/sys lacks `net` (`HIDE_SYSCTL_NET`: a tmpfs with the other
  /proc/sys subtrees bound back); nothing else of the host changes;
- exec: `runsc exec` cannot pass extra fds into the sandbox, so the command's stdio are runsc's
  own pipes (runsc's error messages, if any, land in the command's stderr); there is no
  `--pid-file` tree kill: a timeout sends SIGTERM through runsc (forwarded to tini, which
  signals the command's process group), then kills runsc and the sandbox process tree;
- live quotas: there is no `runsc update`; `update` writes the sandbox's cgroup (the same
  `<parent>/<env-id>` path runc uses), which is also what the elastic provisioner writes;
- the sandbox's processes are runsc-sandbox/runsc-gofer on the host; the environment's own
  processes are invisible to the host's /proc (cgroup membership lists the sandbox).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Mapping, Sequence

from rollstack.errors import InvalidRequest, RuntimeFailure
from rollstack.host import fdwait
from rollstack.run import cgroupfs
from rollstack.run.ocispec import EXEC_WRAPPER_PATH, cpu_quota
from rollstack.run.runc import (
    DEFAULT_OUTPUT_LIMIT, TIMEOUT_EXIT_CODE, ContainerState, ExecResult, OnOutput, Runc,
)

DEFAULT_PLATFORM = "ptrace"
# `sh -c HIDE_SYSCTL_NET sh CMD...` in a private mount namespace: CMD sees /proc/sys without net
HIDE_SYSCTL_NET = r"""set -e
d=$(mktemp -d /run/rollstack-gvisor.XXXXXX)
mount --bind /proc/sys "$d"
mount -t tmpfs -o mode=0555 tmpfs /proc/sys
for s in "$d"/*; do
  n=${s##*/}
  [ "$n" = net ] && continue
  mkdir "/proc/sys/$n" && mount --bind "$s" "/proc/sys/$n"
done
umount -l "$d" && rmdir "$d"
exec "$@"
"""


def joins_netns(bundle: Path) -> bool:
    """Whether the bundle's spec joins an existing network namespace (a network policy)."""
    spec = json.loads((Path(bundle) / "config.json").read_text())
    return any(ns.get("type") == "network" and ns.get("path")
               for ns in spec.get("linux", {}).get("namespaces", []))


def runsc_available(binary: str = "runsc") -> bool:
    return shutil.which(binary) is not None or os.access(binary, os.X_OK)


class Runsc(Runc):
    """runsc with a private state root; `network` decides per container (see module doc)."""

    def __init__(self, root: Path, binary: str = "runsc", platform: str = DEFAULT_PLATFORM,
                 cgroup_parent: str = "rollstack") -> None:
        super().__init__(root, binary)
        self.platform = platform
        self.cgroup_parent = cgroup_parent

    def _cmd(self, *args: str) -> list[str]:
        return [self.binary, "--root", str(self.root), f"--platform={self.platform}", *args]

    def run_detached(self, container_id: str, bundle: Path, log: Path | None = None,
                     timeout: float = 60.0, new_keyring: bool = True) -> int:
        # `new_keyring`: the runc engine's option; gVisor emulates keyrings in its own kernel.
        log = Path(log or Path(bundle) / "runsc.log")
        pid_file = Path(bundle) / "init.pid"
        pid_file.unlink(missing_ok=True)
        networked = joins_netns(bundle)
        cmd = self._cmd("--network=sandbox" if networked else "--network=none", "--log", str(log),
                        "run", "-detach", "-pid-file", str(pid_file), "-bundle", str(bundle), container_id)
        if networked:  # see HIDE_SYSCTL_NET
            cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", HIDE_SYSCTL_NET, "sh", *cmd]
        err_path = Path(bundle) / "runsc.stderr"  # a file: the sandbox inherits it (a pipe would never close)
        try:
            with open(err_path, "wb") as err_file, open(_private_null(Path(bundle)), "r+b", buffering=0) as null:
                proc = subprocess.run(cmd, stdin=null, stdout=null, stderr=err_file, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise RuntimeFailure(f"runsc run {container_id} timed out after {timeout}s") from e
        except FileNotFoundError as e:
            raise RuntimeFailure(f"runtime: runsc is not installed on this node ({self.binary})") from e
        if proc.returncode != 0:
            err = err_path.read_text(errors="replace").strip()
            try:
                err = err or log.read_text(errors="replace")[-2000:]
            except OSError:
                pass
            raise RuntimeFailure(f"runsc run {container_id} failed: {err[-1000:]}",
                                 returncode=proc.returncode, log=err)
        return int(pid_file.read_text().strip())

    def has_state(self, container_id: str) -> bool:
        return any(self.root.glob(f"{container_id}_sandbox:*"))

    def drop_state(self, container_id: str) -> None:
        for p in self.root.glob(f"{container_id}_sandbox:*"):
            p.unlink(missing_ok=True)

    def list(self) -> list[ContainerState]:
        raw = self._run("list", "-format", "json").stdout.strip()
        items = json.loads(raw) if raw and raw != b"null" else []
        return [ContainerState(d["id"], d["status"], int(d.get("pid") or 0), d.get("bundle", ""))
                for d in items or []]

    def update(self, container_id: str, cpu: float | None = None, memory: int | None = None,
               pids: int | None = None, cpu_period_us: int = 100_000) -> None:
        """Write the sandbox's cgroup directly (runsc has no `update`)."""
        if cpu is not None and cpu <= 0:
            raise InvalidRequest(f"cpu must be positive, not {cpu}")
        for cg in cgroupfs.env_cgroup_dirs(container_id, self.cgroup_parent):
            writes: list[tuple[str, str]] = []
            if memory is not None:
                writes += [("memory.limit_in_bytes", str(int(memory))), ("memory.max", str(int(memory)))]
            if cpu is not None:
                q = cpu_quota(cpu, cpu_period_us)
                writes += [("cpu.cfs_period_us", str(cpu_period_us)), ("cpu.cfs_quota_us", str(q)),
                           ("cpu.max", f"{q} {cpu_period_us}")]
            if pids is not None:
                writes.append(("pids.max", str(int(pids))))
            for name, value in writes:
                if (cg / name).exists():
                    try:
                        (cg / name).write_text(value)
                    except OSError as e:
                        raise RuntimeFailure(f"cgroup {cg / name} <- {value}: {e.strerror}") from None

    def exec(self, container_id: str, argv: Sequence[str], *, cwd: str | None = None,
             env: Mapping[str, str] | None = None, stdin: bytes | None = None,
             timeout: float | None = None, output_limit: int = DEFAULT_OUTPUT_LIMIT,
             on_output: OnOutput | None = None, drain_grace: float = 0.2,
             control: object | None = None) -> ExecResult:
        if control is not None:  # an ExecControl (open stdin, signals): runc's exec pump only
            control.finish()  # type: ignore[attr-defined]
            raise RuntimeFailure("attached processes (open stdin, signals; e.g. E2B background commands) "
                                 "are not supported with runtime: runsc")
        if not argv or any(not isinstance(a, str) or "\x00" in a for a in argv):
            raise InvalidRequest("argv must be a non-empty list of strings without NUL")
        if timeout is not None and not timeout > 0:
            raise InvalidRequest(f"timeout must be positive, not {timeout}")
        args = ["exec"]
        if cwd:
            if not cwd.startswith("/") or "\x00" in cwd:
                raise InvalidRequest(f"cwd must be an absolute path: {cwd!r}")
            args += ["-cwd", cwd]
        for k, v in (env or {}).items():
            if not k or "=" in k or "\x00" in k or "\x00" in v:
                raise InvalidRequest(f"invalid environment variable {k!r}")
            args += ["-env", f"{k}={v}"]
        # gVisor (this release) has no PR_SET_CHILD_SUBREAPER: tini runs without -s, still
        # forwarding signals to the command's process group (-g); its not-PID-1 warning muted.
        args += ["-env", "TINI_VERBOSITY=0", container_id, EXEC_WRAPPER_PATH, "-g", "--", *argv]
        t0 = time.monotonic()
        # stdin is always a pipe of ours (closed at once without input): runsc hands the command's
        # stdio to the sandbox's user with fchown, which must never meet the host's /dev/null
        proc = subprocess.Popen(self._cmd(*args), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        return _pump(proc, stdin, timeout, output_limit, on_output, t0)


def _pump(proc: subprocess.Popen, stdin: bytes | None, timeout: float | None, limit: int,
          on_output: OnOutput | None, t0: float) -> ExecResult:
    """Feed stdin, collect stdout/stderr (each capped at `limit`), enforce the timeout."""
    if proc.stdin is not None:
        try:
            if stdin is not None:
                proc.stdin.write(stdin)
        except BrokenPipeError:
            pass
        proc.stdin.close()
    bufs = {"stdout": bytearray(), "stderr": bytearray()}
    fds = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr"}  # type: ignore[union-attr]
    truncated = timed_out = False
    deadline = None if timeout is None else t0 + timeout
    while fds:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = fdwait.wait(list(fds), wait)
        if not ready:
            timed_out = True
            _stop(proc)
            break
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                del fds[fd]
                continue
            name = fds[fd]
            room = limit - len(bufs[name])
            if len(chunk) > room:
                chunk, truncated = chunk[:max(room, 0)], True
            bufs[name].extend(chunk)
            if chunk and on_output is not None:
                on_output(name, chunk)
    code = proc.wait()
    for f in (proc.stdout, proc.stderr):
        f.close()  # type: ignore[union-attr]
    exit_code = TIMEOUT_EXIT_CODE if timed_out else (128 - code if code < 0 else code)
    return ExecResult(exit_code, bytes(bufs["stdout"]), bytes(bufs["stderr"]),
                      time.monotonic() - t0, timed_out=timed_out, truncated=truncated)


def _stop(proc: subprocess.Popen, grace: float = 1.0) -> None:
    """SIGTERM through runsc (it forwards to tini -> the command's group), then SIGKILL runsc."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def _private_null(bundle: Path) -> Path:
    """A null device node of the environment's own (`<bundle>/null`, 1:3, 0666): the sandbox's
    stdio. runsc hands its stdio to the sandbox's user (nobody) with fchown, so given the host's
    /dev/null it would chown the host's /dev/null; this node goes with the bundle."""
    null = bundle / "null"
    if not null.exists():
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        os.chmod(null, 0o666)
    return null
