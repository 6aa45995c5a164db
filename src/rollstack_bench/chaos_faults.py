"""The faults `rollstack bench chaos` injects into a live node, each one a function of `Rig`.

A fault returns a `Fault`: what was done, when (monotonic seconds), and whom it may hurt:
`target` names one environment (its PID 1 killed, its exec shim killed, its own exhaustion, a
client that hung up on it) or is None for a node-wide fault (the agent or the lazy store daemon
killed, the registry unreachable, the disk nearly full), whose `end` is when the node is back.
A fault that found nothing to hit (no environment alive, no exec in flight) says `skipped`.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rollstack.run.procs import descendants

OUTAGE_SECONDS = 10.0


@dataclass
class Fault:
    kind: str
    start: float
    end: float
    target: str | None = None
    detail: str = ""
    skipped: bool = False

    def to_dict(self, t0: float) -> dict[str, Any]:
        return {"kind": self.kind, "t": round(self.start - t0, 3), "seconds": round(self.end - self.start, 3),
                "target": self.target, "detail": self.detail, "skipped": self.skipped}


@dataclass
class Rig:
    """What the faults act on: the node's config, the registry, the client, the disk ballast."""

    config: Any
    registry: Any
    client: Any
    ballast: Path
    rng: random.Random
    agent_pid: Callable[[], int | None]
    restart_agent: Callable[[], None]
    open_stream: Callable[[str], Any]
    lock: threading.Lock = field(default_factory=threading.Lock)


def _now() -> float:
    return time.monotonic()


def _live_env(rig: Rig) -> Any | None:
    try:
        envs = [e for e in rig.client.list() if e.state == "running"]
    except Exception:  # noqa: BLE001 - the node may be down right now: nothing to target
        return None
    return rig.rng.choice(envs) if envs else None


def _init_pid(rig: Rig, env_id: str) -> int | None:
    try:
        return int(json.loads((rig.config.root / "runc" / env_id / "state.json").read_text())["init_process_pid"])
    except (OSError, KeyError, TypeError, ValueError):
        return None


def kill_agent(rig: Rig) -> Fault:
    """SIGKILL the node agent, then start it again (it re-adopts its environments)."""
    start = _now()
    pid = rig.agent_pid()
    if pid is None:
        return Fault("kill_agent", start, _now(), skipped=True, detail="no agent pid")
    os.kill(pid, signal.SIGKILL)
    _wait_gone(pid)
    rig.restart_agent()
    return Fault("kill_agent", start, _now(), detail=f"pid {pid}")


def kill_lazy_daemon(rig: Rig) -> Fault:
    """SIGKILL the lazy store daemon; the node serves on through its successor."""
    from rollstack.node.recovery import daemon_pids

    start = _now()
    pids = daemon_pids(rig.config.root / "lazy" / "mnt")
    if not pids:
        return Fault("kill_lazy_daemon", start, _now(), skipped=True, detail="no daemon")
    os.kill(pids[0], signal.SIGKILL)
    deadline = start + 60
    while _now() < deadline and (not daemon_pids(rig.config.root / "lazy" / "mnt")
                                 or daemon_pids(rig.config.root / "lazy" / "mnt") == pids):
        time.sleep(0.2)
    return Fault("kill_lazy_daemon", start, _now(), detail=f"pid {pids[0]}")


def kill_env_init(rig: Rig) -> Fault:
    """SIGKILL one running environment's PID 1 (its rollout is lost: the fault hit it)."""
    start = _now()
    env = _live_env(rig)
    pid = _init_pid(rig, env.id) if env is not None else None
    if env is None or pid is None:
        return Fault("kill_env_init", start, _now(), skipped=True, detail="no running environment")
    os.kill(pid, signal.SIGKILL)
    return Fault("kill_env_init", start, _now(), target=env.id, detail=f"pid {pid}")


def kill_exec_shim(rig: Rig) -> Fault:
    """SIGKILL the per-command shim of an exec in flight (or a `runc exec` process)."""
    start = _now()
    deadline = start + 5
    while _now() < deadline:
        env = _live_env(rig)
        pid = _init_pid(rig, env.id) if env is not None else None
        shims = descendants(pid)[:1] if pid else []  # the init's direct child serving an exec
        if env is not None and shims:
            os.kill(shims[0], signal.SIGKILL)
            return Fault("kill_exec_shim", start, _now(), target=env.id, detail=f"pid {shims[0]}")
        time.sleep(0.05)
    return Fault("kill_exec_shim", start, _now(), skipped=True, detail="no exec in flight")


def registry_outage(rig: Rig) -> Fault:
    """The registry unreachable for OUTAGE_SECONDS (stopped, then started on the same port)."""
    start = _now()
    rig.registry.stop()
    time.sleep(OUTAGE_SECONDS)
    rig.registry.start()
    return Fault("registry_outage", start, _now(), detail=rig.registry.url)


def disk_full(rig: Rig) -> Fault:
    """The node root's filesystem filled to a few MiB free for OUTAGE_SECONDS."""
    start = _now()
    st = os.statvfs(rig.ballast.parent)
    size = max(0, st.f_bavail * st.f_frsize - (4 << 20))
    try:
        with open(rig.ballast, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, size) if size else None
        time.sleep(OUTAGE_SECONDS)
    finally:
        rig.ballast.unlink(missing_ok=True)
    return Fault("disk_full", start, _now(), detail=f"{size >> 20} MiB ballast")


def exhaust_env(rig: Rig) -> Fault:
    """An environment of its own that exhausts its memory, then its pids; the node must stay
    healthy and the environment end typed (`oom_terminated`) or contained."""
    start = _now()
    from rollstack_bench.env import busybox_plan

    plan = busybox_plan(resources={"cpu": 0.5, "memory": "64Mi", "max_cpu": 1, "max_memory": "96Mi"},
                        evaluator=None, name="chaos-exhaust")
    detail = []
    try:
        env = rig.client.create(plan)
    except Exception as e:  # noqa: BLE001 - reported: a node-wide fault may be running
        return Fault("exhaust_env", start, _now(), skipped=True, detail=f"create: {type(e).__name__}")
    try:
        for cmd in ("x=$(yes | head -c 400000000); echo ${#x}", "b() { b | b & }; b; sleep 2"):
            try:
                r = env.exec(cmd, timeout=20)
                detail.append(f"exit {r.exit_code}")
            except Exception as e:  # noqa: BLE001 - the typed code is what we record
                detail.append(getattr(e, "code", type(e).__name__))
    finally:
        try:
            env.destroy()
        except Exception as e:  # noqa: BLE001
            detail.append(f"destroy: {getattr(e, 'code', type(e).__name__)}")
    return Fault("exhaust_env", start, _now(), target=env.id, detail=", ".join(detail))


def disconnect_stream(rig: Rig) -> Fault:
    """A client that hangs up in the middle of a streaming exec; the command's tree must end."""
    start = _now()
    env = _live_env(rig)
    if env is None:
        return Fault("disconnect_stream", start, _now(), skipped=True, detail="no running environment")
    try:
        rig.open_stream(env.id)
    except Exception as e:  # noqa: BLE001 - the environment may be going away meanwhile
        return Fault("disconnect_stream", start, _now(), target=env.id, detail=f"{type(e).__name__}")
    return Fault("disconnect_stream", start, _now(), target=env.id)


def _wait_gone(pid: int, timeout: float = 30.0) -> None:
    deadline = _now() + timeout
    while _now() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state == "Z":
            return
        time.sleep(0.05)


FAULTS: dict[str, Callable[[Rig], Fault]] = {
    "kill_lazy_daemon": kill_lazy_daemon,
    "kill_agent": kill_agent,
    "kill_exec_shim": kill_exec_shim,
    "kill_env_init": kill_env_init,
    "registry_outage": registry_outage,
    "disk_full": disk_full,
    "exhaust_env": exhaust_env,
    "disconnect_stream": disconnect_stream,
}
"""Every fault, in the order a run cycles through them."""


def small_fs(image: Path, path: Path, size_mb: int) -> None:
    """A `size_mb` ext4 filesystem (a loop-mounted image file) at `path`: the node root, small
    enough for the disk-full fault to fill."""
    with open(image, "wb") as f:
        f.truncate(size_mb << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(path)], check=True)


def unmount_small_fs(path: Path) -> None:
    """Unmount the node root's filesystem (lazily if something still holds it: never left)."""
    if subprocess.run(["umount", str(path)], check=False).returncode != 0:
        subprocess.run(["umount", "-l", str(path)], check=False)
