"""`LazyStoreClient`: start, talk to and stop the node's lazy store daemon (sync, thread-safe).

    lazy = LazyStoreClient.start(DaemonConfig.of(mountpoint, state_dir, store_url, neighbor_bytes=0))
    lazy.add_layers([{"repo": "os/base", "digest": "sha256:..."}])    # or plan.LayerRef objects
    lowerdirs = [lazy.layer_dir(d) for d in reversed(stack_digests)]  # top layer first
    lazy.begin_env(env_id, refs, trace_key="stack+task", background=True)
    lazy.begin_envs([id1, id2, ...], refs, trace_key=...)          # a GRPO group in one request
    ...
    lazy.env_stats(env_id); lazy.end_env(env_id); lazy.stop()

The daemon is a separate process (pyfuse3 runs its own trio loop); the client speaks HTTP to
its unix control socket. `stop()` asks it to unmount and exit, then escalates (SIGTERM, SIGKILL,
lazy unmount) so a stop never leaves the host with a hung mount.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

import httpx
import pydantic

from rollstack.errors import InvalidRequest, NodeUnavailable, RollstackError, from_dict
from rollstack.core.httppool import PerThreadClient
from rollstack.lazystore.config import DaemonConfig, daemon_argv
from rollstack.lazystore.recovery import clear_stale, lazy_unmount, mounted_at
from rollstack.lazystore.wire import (BeginEnvBody, BeginEnvsBody, FetchAllBody, LayersBody, PeersBody, PrefetchBody,
                                     ShareTraceBody)


def _refs(refs: Iterable[Any]) -> list[dict[str, Any]]:
    """Layer references from dicts or objects with .repo/.digest (e.g. plan.LayerRef)."""
    return [{"repo": r.get("repo"), "digest": r.get("digest")} if isinstance(r, dict)
            else {"repo": getattr(r, "repo", None), "digest": getattr(r, "digest", None)} for r in refs]


def _body(model: type[pydantic.BaseModel], **fields: Any) -> dict[str, Any]:
    """A request body built (and checked) by its wire model; InvalidRequest if it does not fit."""
    try:
        return model(**fields).model_dump(mode="json", by_alias=True)
    except pydantic.ValidationError as exc:
        raise InvalidRequest(f"{model.__name__}: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from None


class LazyStoreClient:
    def __init__(self, mountpoint: str | os.PathLike[str], socket_path: str | os.PathLike[str], *,
                 process: subprocess.Popen | None = None, timeout: float = 300.0) -> None:
        self.mountpoint = Path(mountpoint)
        self.socket_path = Path(socket_path)
        self.process = process
        # one connection pool per thread: a pool shared by the node's create threads failed
        # with EBADF under bursts (rollstack.core.httppool)
        self._pool = PerThreadClient(lambda ssl_context: httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.socket_path), verify=ssl_context),
            base_url="http://lazystore", timeout=timeout), f"lazy store at {self.socket_path}")

    @property
    def _http(self) -> httpx.Client:
        return self._pool.get()

    # -- lifecycle -------------------------------------------------------------------------
    @classmethod
    def start(cls, config: DaemonConfig, *, wait: float = 30.0,
              log_path: str | os.PathLike[str] | None = None) -> "LazyStoreClient":
        """Launch a daemon with `config` (its one JSON argument, lazystore/config.py) and return once
        the mount and the control socket are up."""
        mountpoint, state_dir, sock = config.mountpoint, config.state_dir, config.control_socket
        state_dir.mkdir(parents=True, exist_ok=True)
        from rollstack.lazystore import holder  # not at import: `python -m rollstack.lazystore.holder` runs it

        if holder.ping(state_dir) is None:  # a held connection is not stale: the new daemon takes it
            clear_stale(mountpoint)
        log = open(log_path or state_dir / "daemon.log", "ab")
        proc = subprocess.Popen(daemon_argv(sys.executable, config), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=log, start_new_session=True)
        log.close()
        client = cls(mountpoint, sock, process=proc)
        deadline_at = time.monotonic() + wait
        while True:
            if proc.poll() is not None:
                raise NodeUnavailable(f"lazy store daemon exited with {proc.returncode}; see {state_dir / 'daemon.log'}")
            if mounted_at(mountpoint) is not None and client.healthy():
                return client
            if time.monotonic() > deadline_at:
                client.stop()
                raise NodeUnavailable(f"lazy store daemon did not come up within {wait}s; see {state_dir / 'daemon.log'}")
            time.sleep(0.02)

    @classmethod
    def connect(cls, mountpoint: str | os.PathLike[str], state_dir: str | os.PathLike[str]) -> "LazyStoreClient":
        """A client for an already running daemon."""
        return cls(mountpoint, Path(state_dir) / "control.sock")

    def healthy(self) -> bool:
        try:
            return self._http.get("/healthz", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, timeout: float = 10.0) -> None:
        """Unmount and end the daemon; never leaves a hung mount behind. Idempotent."""
        if self._pool.closed:
            return
        try:
            self._http.post("/v1/shutdown", timeout=2.0)
        except httpx.HTTPError:
            pass
        proc = self.process
        if proc is not None:
            for sig in (None, signal.SIGTERM, signal.SIGKILL):
                if sig is not None and proc.poll() is None:
                    try:
                        os.kill(proc.pid, sig)
                    except ProcessLookupError:
                        pass
                try:
                    proc.wait(timeout=timeout if sig is None else 5.0)
                    break
                except subprocess.TimeoutExpired:
                    continue
        elif mounted_at(self.mountpoint) is not None:  # a daemon we did not start: give it time to unmount
            deadline = time.monotonic() + timeout
            while mounted_at(self.mountpoint) is not None and time.monotonic() < deadline:
                time.sleep(0.05)
        if mounted_at(self.mountpoint) is not None and (proc is None or proc.poll() is not None):
            lazy_unmount(self.mountpoint)
        self._pool.close()

    def __enter__(self) -> "LazyStoreClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- calls -----------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        try:
            kw: dict[str, Any] = {"json": body} if body is not None else {}
            if timeout is not None:
                kw["timeout"] = timeout
            resp = self._http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise NodeUnavailable(f"lazy store daemon unreachable at {self.socket_path}: {exc}") from None
        if resp.status_code >= 400:
            try:
                err = from_dict(resp.json()["error"])
            except (ValueError, KeyError, TypeError):
                err = RollstackError(f"lazy store daemon: HTTP {resp.status_code}")
            raise err
        if resp.headers.get("content-type", "").startswith("application/json"):
            return resp.json()
        return resp.content

    def add_layers(self, refs: Iterable[Any]) -> dict[str, Any]:
        """Load layers by TOC; returns {"layers": [{digest, toc_seconds, toc_bytes, ...}], "seconds", "bytes"}."""
        return self._call("POST", "/v1/layers", _body(LayersBody, layers=_refs(refs)))

    def layer_dir(self, digest: str) -> Path:
        return self.mountpoint / "layers" / digest.partition(":")[2]

    def fetch_all(self, refs: Iterable[Any], background: bool = False) -> dict[str, Any]:
        """Fetch every chunk of these layers not local yet: now (the rollstack-eager mode), or
        `background`: as gated background fill (yields to demand reads, bounded link share)."""
        return self._call("POST", "/v1/fetch_all", _body(FetchAllBody, layers=_refs(refs), background=background),
                          timeout=None if not background else 24 * 3600.0)

    def begin_env(self, env_id: str, layer_refs: Iterable[Any], trace_key: str | None = None,
                  background: bool = True, fallback_key: str | None = None) -> dict[str, Any]:
        """Register an environment; its trace prefetch starts at once. `trace_source` and
        `trace_prefetch_chunks` are final once `trace_lookup` is "done" (env_stats, end_env)."""
        body = _body(BeginEnvBody, layers=_refs(layer_refs), trace_key=trace_key, background=background,
                     fallback_key=fallback_key)
        return self._call("POST", f"/v1/envs/{env_id}", body)

    def begin_envs(self, env_ids: Sequence[str], layer_refs: Iterable[Any], trace_key: str | None = None,
                   background: bool = True, fallback_key: str | None = None) -> dict[str, Any]:
        """`begin_env` for the environments of one group in one request (1..256 unique ids):
        {"layers": ..., "envs": [begin_env's answer per id, in order]}."""
        body = _body(BeginEnvsBody, ids=list(env_ids), layers=_refs(layer_refs), trace_key=trace_key,
                     background=background, fallback_key=fallback_key)
        return self._call("POST", "/v1/envs", body)

    def env_stats(self, env_id: str) -> dict[str, Any]:
        """{fetched_bytes, from_cache_bytes, from_peer_bytes, stall_seconds, critical_path_bytes, ...}"""
        return self._call("GET", f"/v1/envs/{env_id}")

    def end_env(self, env_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/envs/{env_id}")

    def share_trace(self, env_id: str, keys: Sequence[str]) -> int:
        """What `env_id` read so far, stored and published as the traces of `keys`; chunks."""
        return int(self._call("POST", f"/v1/envs/{env_id}/trace", _body(ShareTraceBody, keys=list(keys)))["chunks"])

    def prefetch(self, trace_key: str, env_id: str | None = None) -> dict[str, Any]:
        return self._call("POST", "/v1/prefetch", _body(PrefetchBody, trace_key=trace_key, env_id=env_id))

    def stats(self) -> dict[str, Any]:
        return self._call("GET", "/v1/stats")

    def metrics(self) -> str:
        resp = self._http.get("/metrics")
        return resp.text

    def set_peers(self, urls: Sequence[str], self_url: str | None = None) -> list[str]:
        return self._call("PUT", "/v1/peers", _body(PeersBody, urls=list(urls), self_url=self_url))["urls"]

    def drop_caches(self) -> None:
        self._call("POST", "/v1/drop_caches", {})

    def chunk(self, digest: str) -> bytes | None:
        resp = self._http.get(f"/v1/chunks/{digest}")
        return resp.content if resp.status_code == 200 else None
