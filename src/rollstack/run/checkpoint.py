"""CRIU checkpoints of a runc environment: `pause(mode="checkpoint")` (docs/fork.md).

`checkpoint(env, criu)` dumps every process of the environment into `<env dir>/checkpoint` with
CRIU (`runc checkpoint`) and ends them: the environment keeps its files, mounts and network
namespace, and holds no memory, CPU or pid until `restore(env, criu)` (`runc restore`) brings the
same processes back on this node (their memory, pids inside, open files, cwd; a background
server goes on where it was). A checkpointed environment is marked in its meta.json
(`is_checkpointed`), so a restarted node agent re-adopts it without a container.

The exec agent (rollstack-execd, PID 1) moves its listener into the environment first
(SIGUSR1): the node made its listening socket in the host's network namespace, which CRIU cannot
dump (`Unix socket ... not found`); execd swaps it for one of its own at an abstract address of
the environment's network namespace, which CRIU dumps and restores with the processes. meta.json
says so (`"agent": "netns"`) and execs reach it there from then on (rollstack.run.agent.
NetnsAgent), before and after the restore, as fast as before. Only where execd could not make
it (its address taken by the environment's own processes) do execs go through `runc exec`.

What CRIU refuses is raised as RuntimeFailure with CRIU's own last errors (e.g. an exec in
flight: its pipes and connection lead out of the environment); CRIU thaws the processes then,
and the environment runs on. gVisor sandboxes are not checkpointed here.

CRIU itself is built by `make setup` (third_party/criu/build.sh: Debian 12's criu cannot start
on this kernel); `find_criu` finds it ($ROLLSTACK_CRIU, then /usr/local/libexec/rollstack/criu).
"""

from __future__ import annotations

import os
import logging
import signal
import time
from typing import TYPE_CHECKING

from rollstack.errors import InvalidRequest, RuntimeFailure
from rollstack.host.tree import remove_tree
from rollstack.run import agent, handle, teardown

if TYPE_CHECKING:
    from rollstack.run.handle import Environment

log = logging.getLogger(__name__)

IMAGES_DIR = "checkpoint"
WORK_DIR = "checkpoint-work"
CRIU_PATHS = ("/usr/local/libexec/rollstack/criu",)
AGENT_STOP_TIMEOUT = 10.0
RESEND_INTERVAL = 1.0
"""SIGUSR1 is sent again this often while execd has not moved (one more is harmless: execd
moves once)."""
LISTEN_FD = 3
"""rollstack-execd's listening socket (native/execd/execd.c LISTEN_FD)."""


def find_criu() -> str | None:
    """The CRIU binary checkpoints use, or None (then `pause(mode="checkpoint")` answers
    `invalid_request` saying so)."""
    for path in (os.environ.get("ROLLSTACK_CRIU"), *CRIU_PATHS):
        if path and os.access(path, os.X_OK):
            return path
    return None


def is_checkpointed(env: "Environment") -> bool:
    return bool(env.meta().get("checkpointed"))


def checkpoint(env: "Environment", criu: str) -> dict[str, float]:
    """Dump and end `env`'s processes (see the module doc); {"seconds", "bytes"} of the dump."""
    if env.runtime_name != "runc":
        raise InvalidRequest(f"environment {env.id} runs on {env.runtime_name}: checkpoints need runc")
    t0 = time.perf_counter()
    _move_agent(env)
    images, work = env.dir / IMAGES_DIR, env.dir / WORK_DIR
    for d in (images, work):
        remove_tree(d)
    images.mkdir()
    images.chmod(0o755)  # whatever the umask: a user-namespaced restore reads it as the container's root
    init = env._init_pid()
    try:
        env.engine.checkpoint(env.id, images, work, criu)
    except BaseException:
        remove_tree(images)
        raise
    # dumped and ended: from here on nothing may fail (the caller marks it checkpointed)
    if init is not None:
        teardown.reap(init)  # the node is its subreaper: the ended init is our zombie
    (env.bundle / "init.pid").unlink(missing_ok=True)  # that pid is no longer ours
    try:
        meta = env.meta()
        meta["checkpointed"] = True
        env._write_meta(meta)
        size = sum(p.stat().st_size for p in images.iterdir() if p.is_file())
    except OSError:  # a full disk: the node's record says checkpointed as well (node.recovery)
        log.exception("recording the checkpoint of %s in its meta.json failed", env.id)
        size = 0
    return {"seconds": round(time.perf_counter() - t0, 6), "bytes": float(size)}


def forget(env: "Environment") -> None:
    """Drop the checkpointed mark from meta.json (its processes run again)."""
    meta = env.meta()
    if meta.pop("checkpointed", None) is not None:
        env._write_meta(meta)


def restore(env: "Environment", criu: str) -> dict[str, float]:
    """The checkpointed processes back (`runc restore`); the dump is removed after."""
    t0 = time.perf_counter()
    images, work = env.dir / IMAGES_DIR, env.dir / WORK_DIR
    if not images.is_dir():
        raise RuntimeFailure(f"environment {env.id} has no checkpoint to restore", path=str(images))
    remove_tree(work)
    env.pid = env.engine.restore(env.id, env.bundle, images, work, criu)
    try:  # the processes run again: what is left is bookkeeping, never a failed resume
        forget(env)
        remove_tree(images)
        remove_tree(work)
    except OSError:  # a full disk, an I/O error: a restarted node sees the running container
        log.exception("cleaning up after the restore of %s failed", env.id)
    return {"seconds": round(time.perf_counter() - t0, 6)}


def _move_agent(env: "Environment") -> None:
    """rollstack-execd listens inside the environment (SIGUSR1; its fd 3 turns from the node's
    socket into its own in one step, or closes when it cannot make one); returns once it did,
    with meta.json saying where execs find it and the node's socket file removed. No-op when
    there is no such file (no agent, or moved by an earlier checkpoint)."""
    path = agent.socket_path(env.dir)
    if not path.exists():
        return
    pid = env._init_pid()
    if pid is None or not env.init_alive():
        raise RuntimeFailure(f"environment {env.id} has no running init to checkpoint")
    listener = now = _fd_target(pid, LISTEN_FD)
    if listener.startswith("socket:") and not _listens_inside(pid, listener):
        deadline = time.monotonic() + AGENT_STOP_TIMEOUT
        asked = -RESEND_INTERVAL
        while (now := _fd_target(pid, LISTEN_FD)) == listener:
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"the exec agent of {env.id} still listens on the node's socket "
                                     f"{AGENT_STOP_TIMEOUT:.0f} s after it was asked to move")
            if time.monotonic() - asked >= RESEND_INTERVAL and _takes_sigusr1(pid):
                if not teardown.signal_init(env, signal.SIGUSR1):
                    raise RuntimeFailure(f"environment {env.id}'s init is gone: nothing to checkpoint")
                asked = time.monotonic()
            time.sleep(0.002)
    meta = env.meta()
    meta["agent"] = handle.AGENT_IN_NETNS if now.startswith("socket:") else "runc"
    env._write_meta(meta)
    path.unlink(missing_ok=True)


def _takes_sigusr1(pid: int) -> bool:
    """Whether PID 1 blocks SIGUSR1, i.e. execd's signalfd will read it. Until execd's first
    step, PID 1 is still runc's init (or just exec'd execd): a SIGUSR1 then is caught by runc's
    Go runtime, or dropped by the kernel for a namespace's init without a handler; lost either
    way (`runc run -d` returns before its init has exec'd execd)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return sigusr1_blocked(f.read())
    except OSError:
        return False


def sigusr1_blocked(status: str) -> bool:
    """Whether a /proc/PID/status text's SigBlk mask has SIGUSR1."""
    for line in status.splitlines():
        if line.startswith("SigBlk:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGUSR1 - 1) & 1)
    return False


def _listens_inside(pid: int, target: str) -> bool:
    """Whether `target` ("socket:[INODE]") is execd's own listener at `agent.NETNS_ADDRESS` in
    PID 1's network namespace: moved already (a move that outlasted an earlier timeout)."""
    address = "@" + agent.NETNS_ADDRESS[1:].decode()
    inode = target.removeprefix("socket:[").removesuffix("]")
    try:
        with open(f"/proc/{pid}/net/unix") as f:
            return any(len(row) >= 8 and row[6] == inode and row[7] == address
                       for row in (line.split() for line in f))
    except OSError:
        return False


def _fd_target(pid: int, fd: int) -> str:
    """What /proc/PID/fd/FD points at ("" when it is not open)."""
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return ""
