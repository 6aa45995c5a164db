"""The node agent process: serve the API (uvicorn) over a `NodeService`; start/stop/status it.

`start` spawns `python -m rollstack.node.agent serve CONFIG_JSON` in its own session (logs to
`<root>/agent.log`) and returns once `/healthz` answers; the agent writes `<root>/agent.pid` and,
if missing, a random token to the token file (0600). `stop` sends SIGTERM: uvicorn finishes, the
service destroys the environments it owns and stops the lazy store.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rollstack.core.httppool import SERVER_KEEPALIVE_S
from rollstack.errors import InternalError, NodeUnavailable, RootInUse, RuntimeFailure
from rollstack.node.config import NodeConfig

log = logging.getLogger(__name__)

START_TIMEOUT = 120.0
STOP_TIMEOUT = 120.0


def ensure_token(path: Path) -> str:
    """The token in `path`, creating a random one (mode 0600) if the file is missing or empty."""
    try:
        existing = path.read_text().strip()
    except FileNotFoundError:
        existing = ""
    if existing:
        return existing
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.chmod(path, 0o600)
    return token


def serve(config: NodeConfig) -> None:
    """Run the agent in this process until SIGTERM/SIGINT (then stop gracefully)."""
    import uvicorn

    from rollstack.node.api import create_app
    from rollstack.node.service import NodeService

    config.root.mkdir(parents=True, exist_ok=True)
    wait_root_released(config)  # a killed predecessor's threads may still be exiting
    lock = hold_root(config)  # noqa: F841 - held (flock) for the life of this process
    _write_info(config)  # who holds the root, from the moment it does
    token = ensure_token(config.token_path)
    service = NodeService(config)
    # A stop request while starting (recovery, the lazy store) must not kill us half-way with
    # mounts and environments up: note it, finish starting, then stop at once.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _note_signal)
    service.start()
    try:
        if _SIGNALLED:
            return
        config.pid_path.write_text(f"{os.getpid()}\n")
        host, port = config.host_port()
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(service, token, max_body=config.max_file_bytes),
                host=host,
                port=port,
                log_level="warning",
                access_log=False,
                timeout_keep_alive=SERVER_KEEPALIVE_S,
                timeout_graceful_shutdown=30,
            )
        )
        # uvicorn re-raises the signal that stopped it once it has shut down; with the default
        # handlers that would kill us before `finally` destroys the environments we own.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _note_signal)
        server.run()
    finally:
        service.stop()
        _unlink_if_ours(config.pid_path)


def _lock_path(config: NodeConfig) -> Path:
    return config.root / "agent.lock"


def holder(config: NodeConfig) -> dict[str, Any]:
    """What the agent holding the root announced (agent.json), best effort."""
    try:
        return json.loads((config.root / "agent.json").read_text())
    except (OSError, ValueError):
        return {}


def _in_use(config: NodeConfig) -> RootInUse:
    doc = holder(config)
    who = f"node agent pid {doc.get('pid', '?')} serving {doc.get('url', '?')}"
    return RootInUse(f"root {config.root} is held by {who}; stop it first (rollstack node stop --root {config.root})",
                     root=str(config.root), pid=doc.get("pid"), url=doc.get("url"))


def hold_root(config: NodeConfig) -> Any:
    """Take the root's exclusive lock (flock on <root>/agent.lock) for this process's life, or
    raise RootInUse naming the agent that holds it: two agents on one root abort each other's
    FUSE connection and kill each other's environments."""
    import fcntl

    f = open(_lock_path(config), "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise _in_use(config) from None
    return f


ROOT_RELEASE_WAIT = 120.0
"""Seconds a start waits for a dead agent's lock to be released (its threads still exiting)."""


def wait_root_released(config: NodeConfig, timeout: float = ROOT_RELEASE_WAIT) -> bool:
    """True once the root's lock is free, waited for only while its holder is dying: a killed
    agent's main thread is a zombie at once, but the lock (its file) is released only when its
    last thread has exited, which a thread in the middle of a FUSE request or an unmount can
    delay. A holder that is alive and not exiting is another agent: False at once."""
    deadline = time.monotonic() + timeout
    while root_held(config):
        pid = holder(config).get("pid")
        if isinstance(pid, int) and _running(pid):
            return False
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _running(pid: int) -> bool:
    """The process exists and is not exiting (a zombie, or gone, is not running)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def root_held(config: NodeConfig) -> bool:
    """True if a live agent holds the root's lock (probe: take it and let go at once)."""
    import fcntl

    if not _lock_path(config).exists():
        return False
    with open(_lock_path(config), "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return False


def _write_info(config: NodeConfig) -> None:
    """`<root>/agent.json`: where this agent listens, so status/stop find it from the root alone."""
    doc = {"pid": os.getpid(), "url": config.url(), "listen": config.listen, "token_file": str(config.token_path)}
    tmp = config.root / "agent.json.tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, config.root / "agent.json")


def running_config(config: NodeConfig) -> NodeConfig:
    """`config` with the listen address the agent under its root announced (if any)."""
    try:
        doc = json.loads((config.root / "agent.json").read_text())
        return config.model_copy(update={"listen": doc["listen"]})
    except (OSError, ValueError, KeyError):
        return config


_SIGNALLED: list[int] = []


def _note_signal(signum: int, _frame: Any) -> None:
    _SIGNALLED.append(signum)
    log.info("signal %d: stopping", signum)


def _unlink_if_ours(pid_path: Path) -> None:
    try:
        if pid_path.read_text().strip() == str(os.getpid()):
            pid_path.unlink()
    except OSError:
        pass


def read_pid(config: NodeConfig) -> int | None:
    """The agent's pid if its pid file names a live process."""
    try:
        pid = int(config.pid_path.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid


def healthy(config: NodeConfig, timeout: float = 2.0) -> dict[str, Any] | None:
    import httpx

    try:
        r = httpx.get(config.url() + "/healthz", timeout=timeout)
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 else None


def start(config: NodeConfig) -> dict[str, Any]:
    """Start the agent in the background; return once it answers /healthz."""
    pid = read_pid(config)
    if pid is not None and healthy(config):
        return {"pid": pid, "url": config.url(), "root": str(config.root), "already_running": True}
    if root_held(config) and not wait_root_released(config):
        raise _in_use(config)  # a live agent on this root, listening elsewhere (or not up yet)
    config.root.mkdir(parents=True, exist_ok=True)
    ensure_token(config.token_path)
    logf = open(config.log_path, "ab")
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rollstack.node.agent", "serve", config.model_dump_json()],
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=logf,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        logf.close()
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeFailure(f"node agent exited with status {proc.returncode}: {_log_tail(config)}")
        if healthy(config, timeout=1.0):
            return {"pid": proc.pid, "url": config.url(), "root": str(config.root), "already_running": False}
        time.sleep(0.1)
    proc.terminate()
    raise NodeUnavailable(f"node agent did not answer /healthz within {START_TIMEOUT:.0f}s: {_log_tail(config)}")


def _log_tail(config: NodeConfig, lines: int = 15) -> str:
    try:
        return " | ".join(config.log_path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop(config: NodeConfig) -> dict[str, Any]:
    """Stop the agent gracefully (SIGTERM, then SIGKILL after STOP_TIMEOUT)."""
    pid = read_pid(config)
    if pid is None:
        return {"stopped": False, "running": False}
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline:
        if not _alive(pid):
            return {"stopped": True, "pid": pid}
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    raise InternalError(f"node agent {pid} did not stop within {STOP_TIMEOUT:.0f}s; killed")


def _alive(pid: int) -> bool:
    try:
        # A zombie child of ours (tests) counts as gone.
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return False


def status(config: NodeConfig) -> dict[str, Any]:
    pid = read_pid(config)
    health = healthy(config) if pid is not None else None
    return {
        "running": pid is not None and health is not None,
        "pid": pid,
        "url": config.url(),
        "root": str(config.root),
        "health": health,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "serve":
        print("usage: python -m rollstack.node.agent serve CONFIG_JSON", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve(NodeConfig.model_validate(json.loads(argv[1])))
    except RootInUse as exc:
        print(f"error: {exc.code}: {exc}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
