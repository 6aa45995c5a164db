"""`HostAgent`: one rollstack node agent (and its lazy store daemon) on this host, supervised.

What the Ray actor of a node (`rollstack.cluster.actor`) runs, kept free of Ray so it can be
reasoned about alone:

- its own root (`<base>/<node-name>`): env dirs, runc state, lazy store mount + caches,
  materialized layers, token, lock. Several agents on one host never share a root, and every
  environment's cgroup is `rollstack/<env-id>` with a unique id, so they never collide;
- its own ports: the agent's HTTP API and the lazy store daemon's TCP API (for peers), chosen
  free on the host's address once and kept in `<root>/cluster.json`, so a restarted agent comes
  back on the same URL (peers' lists and the pool's view stay valid);
- the agent runs under a guard process (`rollstack.cluster.guard`): if the actor's worker dies
  or the Ray node goes away, Ray SIGKILLs the worker's children (the guard), and the agent, the
  guard's child with PR_SET_PDEATHSIG=SIGTERM, stops gracefully and destroys its environments;
  nothing outlives the actor;
- the supervisor checks the agent every `check_interval` s; a dead or unresponsive agent is
  restarted (its recovery destroys the leftovers of the killed run: envs, mounts, cgroups, an
  orphaned lazy store daemon), with exponential backoff when it keeps dying (a flapping node);
- every `peer_interval` s it hands the daemon the current peers (other nodes' lazy store URLs,
  from `peers()`), so chunks another node holds come from it before the registry.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from rollstack.cluster.guard import die_with_parent
from rollstack.errors import NodeUnavailable, RollstackError

log = logging.getLogger(__name__)

def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class HostAgent:
    def __init__(self, name: str, base_root: Path, store: str, host: str, token: str, *,
                 options: dict[str, Any] | None = None, peers: Callable[[], list[str]] | None = None,
                 check_interval: float = 0.5, peer_interval: float = 3.0, start_timeout: float = 120.0,
                 max_backoff: float = 30.0, netns: str | None = None) -> None:
        self.name = name
        self.netns = netns  # a network namespace (/run/netns/NAME) the agent and its daemon run in
        self.root = Path(base_root) / name
        self.store, self.host, self.token = store, host, token
        self.options = dict(options or {})
        self.peers = peers
        self.check_interval, self.peer_interval = check_interval, peer_interval
        self.start_timeout, self.max_backoff = start_timeout, max_backoff
        self.proc: subprocess.Popen | None = None
        self.state = "starting"
        self.error: str | None = None
        self.restarts = 0
        self.instance: str | None = None
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread: threading.Thread | None = None
        self._pushed_peers: list[str] | None = None
        self.agent_port, self.lazy_port = self._ports()

    # -- configuration ----------------------------------------------------------------------
    def _ports(self) -> tuple[int, int]:
        """The ports this node used before (same URL after a restart), else two free ones."""
        try:
            doc = json.loads((self.root / "cluster.json").read_text())
            if doc.get("host") == self.host:
                return int(doc["agent_port"]), int(doc["lazy_port"])
        except (OSError, ValueError, KeyError):
            pass
        if self.netns:  # its own namespace: nothing else listens there (and host cannot bind its IP)
            return 7878, 7879
        return free_port(self.host), free_port(self.host)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.agent_port}"

    @property
    def lazy_url(self) -> str:
        return f"http://{self.host}:{self.lazy_port}"

    def config(self) -> Any:
        from rollstack.node.config import NodeConfig

        cfg = NodeConfig(root=self.root, store=self.store, listen=f"{self.host}:{self.agent_port}", **self.options)
        return cfg.model_copy(update={"lazy": cfg.lazy.model_copy(update={"listen": f"{self.host}:{self.lazy_port}"})})

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "url": self.url, "lazy_url": self.lazy_url, "root": str(self.root),
                "state": self.state, "error": self.error, "restarts": self.restarts,
                "pid": self.proc.pid if self.proc is not None else None, "instance": self.instance}

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> dict[str, Any]:
        """Start the supervisor; return once the agent first answers (or failed to start)."""
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "cluster.json").write_text(json.dumps(
            {"host": self.host, "agent_port": self.agent_port, "lazy_port": self.lazy_port}))
        fd = os.open(self.root / "token", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.token + "\n")
        self._thread = threading.Thread(target=self._supervise, name=f"rollstack-host-{self.name}", daemon=True)
        self._thread.start()
        self._started.wait(self.start_timeout + 5)
        return self.describe()

    def _spawn(self) -> None:
        cfg = self.config()
        from rollstack.node.agent import root_held

        if root_held(cfg):  # the predecessor of a restarted actor may still be stopping
            deadline = time.monotonic() + 60
            while root_held(cfg) and time.monotonic() < deadline:
                time.sleep(0.2)
        logf = open(cfg.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                [*(["nsenter", f"--net=/run/netns/{self.netns}", "--"] if self.netns else []),
                 sys.executable, "-m", "rollstack.cluster.guard", "--",
                 sys.executable, "-m", "rollstack.node.agent", "serve", cfg.model_dump_json()],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True,
                preexec_fn=die_with_parent,
            )
        finally:
            logf.close()
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline and not self._stop.is_set():
            if self.proc.poll() is not None:
                raise NodeUnavailable(f"node agent on {self.name} exited with status {self.proc.returncode}: "
                                      f"{_log_tail(cfg.log_path)}")
            info = self._probe(timeout=1.0)
            if info is not None:
                self.instance = info.get("instance")
                self._pushed_peers = None
                return
            time.sleep(0.1)
        self._kill()
        raise NodeUnavailable(f"node agent on {self.name} did not answer within {self.start_timeout:.0f}s: "
                              f"{_log_tail(cfg.log_path)}")

    def _probe(self, timeout: float) -> dict[str, Any] | None:
        import httpx

        try:
            r = httpx.get(self.url + "/v1/node", headers={"Authorization": f"Bearer {self.token}"}, timeout=timeout)
        except httpx.HTTPError:
            return None
        return r.json() if r.status_code == 200 else None

    def _supervise(self) -> None:
        backoff, misses = 1.0, 0
        while not self._stop.is_set():
            if self.proc is None or self.proc.poll() is not None or misses >= 6:
                if self.proc is not None:
                    self.restarts += 1
                    self.state = "restarting"
                    log.warning("node agent on %s is gone (status %s); restarting", self.name,
                                self.proc.poll())
                    self._kill()
                try:
                    self._spawn()
                except Exception as exc:  # noqa: BLE001 - reported by describe(); retried with backoff
                    self.state, self.error = "failed", f"{getattr(exc, 'code', type(exc).__name__)}: {exc}"[:2000]
                    self._started.set()
                    log.error("%s", exc)
                    if self._stop.wait(backoff):
                        return
                    backoff = min(self.max_backoff, backoff * 2)
                    continue
                if self._stop.is_set():
                    return
                self.state, self.error, misses = "running", None, 0
                self._started.set()
            elif self._probe(timeout=2.0) is None:
                misses += 1  # 6 misses in a row (~15 s): hung, restart
            else:
                misses = 0
                backoff = max(1.0, backoff / 2)
                self._push_peers()
            self._stop.wait(self.check_interval)

    def _push_peers(self, force: bool = False) -> list[str] | None:
        """Hand the daemon the current peers (every `peer_interval` s, or now with `force`)."""
        if self.peers is None or self.state != "running":
            return None
        now = time.monotonic()
        if not force and self._pushed_peers is not None and now - getattr(self, "_peers_at", 0.0) < self.peer_interval:
            return self._pushed_peers
        self._peers_at = now
        try:
            urls = sorted(u for u in self.peers() if u != self.lazy_url)
        except Exception as exc:  # noqa: BLE001 - peers are an optimisation; try again later
            log.warning("listing peers failed: %s", exc)
            return self._pushed_peers
        if urls == self._pushed_peers:
            return urls
        from rollstack.lazystore.client import LazyStoreClient

        lazy = self.root / "lazy"
        client = LazyStoreClient.connect(lazy / "mnt", lazy / "state")
        try:
            client.set_peers(urls, self.lazy_url)
            self._pushed_peers = urls
        except RollstackError as exc:
            log.warning("handing peers to the lazy store failed: %s", exc)
        finally:
            client._http.close()  # noqa: SLF001 - a client of a daemon we do not own
        return self._pushed_peers

    def sync_peers(self) -> list[str] | None:
        """Push the peers now (`up` calls it once every node runs, so no node starts without them)."""
        return self._push_peers(force=True)

    def _kill(self) -> None:
        """End a hung or half-started agent at once (its guard and the agent itself)."""
        from rollstack.node.agent import read_pid

        pid = read_pid(self.config())
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if pid is not None and _is_agent_of(pid, self.root):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop(self, remove: bool = True, timeout: float = 120.0) -> dict[str, Any]:
        """Stop the agent gracefully (destroys its environments, unmounts, ends the daemon), then
        remove the node's root. Returns what was left (must be nothing)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.start_timeout + 5)
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.state = "stopped"
        self._clean()
        left = leftovers(self.root)
        if remove and not left["mounts"]:
            shutil.rmtree(self.root, ignore_errors=True)
        return {"name": self.name, "stopped": True, "leftovers": left}


    def _clean(self) -> None:
        """What an agent that died hard (or was stopped while starting) left: its environments
        (runc containers, overlay mounts, cgroups, dirs) and an orphaned lazy store daemon — the
        same recovery a restarted agent runs on start."""
        if not self.root.is_dir():
            return
        from rollstack.node.recovery import daemon_pids, end_orphan_daemon
        from rollstack.run.environment import cleanup_leftovers

        try:
            left = cleanup_leftovers(self.root)
            if not left.empty():
                log.warning("%s: cleaned leftovers %s", self.name, left)
        except Exception:  # noqa: BLE001 - report what stays via leftovers()
            log.exception("%s: cleaning environment leftovers failed", self.name)
        lazy = self.root / "lazy"
        if daemon_pids(lazy / "mnt"):
            end_orphan_daemon(lazy / "mnt", lazy / "state")
        from rollstack.lazystore.holder import ping
        from rollstack.lazystore.recovery import clear_stale

        if ping(lazy / "state") is None and clear_stale(lazy / "mnt"):  # no daemon, no holder: a dead mount
            log.warning("%s: unmounted a stale lazy store mount", self.name)


def _is_agent_of(pid: int, root: Path) -> bool:
    """Is `pid` still the node agent of `root` (not a recycled pid)?"""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"rollstack.node.agent" in cmd and str(root).encode() in cmd


def leftovers(root: Path) -> dict[str, list[str]]:
    """Mounts and cgroups of environments under `root` that still exist."""
    prefix = str(Path(root).absolute()) + "/"
    mounts: list[str] = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                mp = line.split()[4]
                if mp.startswith(prefix):
                    mounts.append(mp)
    except OSError:
        pass
    return {"mounts": sorted(mounts)}


def _log_tail(path: Path, lines: int = 8) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"
