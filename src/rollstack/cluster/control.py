"""`up` / `status` / `down`: the node actors of a Ray cluster, as `rollstack cluster ...` runs them.

    up(address, store)   one node actor on every alive Ray node with the `rollstack` resource;
                         returns once each agent answers (or failed to start: that actor is
                         stopped again and the error names it; the others stay up)
    status(address)      each node's URL, environments, capacity and hot stacks
    down(address)        stop every node actor: agents stop gracefully (destroy their envs,
                         unmount, end their daemons), roots are removed, actors killed
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import httpx

from rollstack.cluster import ray_env
from rollstack.cluster.actor import start_actor
from rollstack.errors import ClusterUnavailable, NodeUnavailable

DEFAULT_ROOT = Path("/var/lib/rollstack/cluster")
UP_TIMEOUT = 180.0


def up(address: str | None, store: str, *, root: Path | str | None = None, options: dict[str, Any] | None = None,
       timeout: float = UP_TIMEOUT, start_timeout: float = 120.0) -> dict[str, Any]:
    ray = ray_env.connect(address)
    nodes = ray_env.rollstack_nodes(ray)
    if not nodes:
        raise ClusterUnavailable(
            f"no alive Ray node carries the custom resource '{ray_env.RESOURCE}' "
            "(start environment nodes with: ray start --address HEAD --resources '{\"rollstack\": 1}')")
    existing = ray_env.members(timeout=10.0)
    token = existing[0]["token"] if existing else secrets.token_urlsafe(32)
    spec = {"root": str(Path(root or DEFAULT_ROOT).absolute()), "store": store, "token": token,
            "options": dict(options or {}), "start_timeout": start_timeout}
    handles = {ray_env.actor_name(n["NodeID"]): start_actor(ray, n["NodeID"], spec) for n in nodes}
    deadline = time.monotonic() + timeout
    docs: dict[str, dict[str, Any]] = {}
    while len(docs) < len(handles) and time.monotonic() < deadline:
        for doc in ray_env.members(timeout=min(5.0, max(0.1, deadline - time.monotonic())),
                                   handles={k: v for k, v in handles.items() if k not in docs}):
            docs[doc["node_id"]] = doc
    failed = [{"node_id": d["node_id"], "error": d.get("error")} for d in docs.values() if d["state"] != "running"]
    failed += [{"node_id": name, "error": f"no answer within {timeout:.0f}s"} for name in handles if name not in docs]
    for f in failed:  # a node that cannot start is taken out, not left looping
        _stop_actor(ray, handles[f["node_id"]])
    running = [_public(d) for d in docs.values() if d["state"] == "running"]
    # every daemon knows every peer before the first environment is placed
    ray.get([handles[d["node_id"]].sync_peers.remote() for d in running], timeout=60)
    doc = {"nodes": sorted(running, key=lambda d: d["node_id"]), "failed": failed}
    if failed:
        names = "; ".join(f"{f['node_id']}: {f['error']}" for f in failed)
        raise NodeUnavailable(f"{len(failed)} of {len(handles)} node agents failed to start ({names}); "
                              f"{len(running)} running", **doc)
    return doc


def _public(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "token"}


def node_report(doc: dict[str, Any], timeout: float = 3.0) -> dict[str, Any]:
    """One node's status line: its actor document plus its `GET /v1/node` figures."""
    out = {"node_id": doc["node_id"], "url": doc["url"], "state": doc["state"], "restarts": doc["restarts"],
           "environments": None, "capacity": None, "free": None, "hot_stacks": [], "hot_layers": 0}
    try:
        r = httpx.get(doc["url"] + "/v1/node", headers={"Authorization": f"Bearer {doc['token']}"}, timeout=timeout)
        r.raise_for_status()
        info = r.json()
    except (httpx.HTTPError, ValueError) as exc:
        out["state"], out["error"] = "unreachable", str(exc)
        return out
    out.update(environments=info["environments"], capacity=info["capacity"], free=info["free"],
               hot_layers=len(info["hot_layers"]),
               hot_stacks=sorted({k.split("/task/", 1)[0] for k in info["groups"]}))
    return out


def status(address: str | None) -> dict[str, Any]:
    ray_env.connect(address)
    return {"nodes": [node_report(d) for d in ray_env.members(timeout=10.0)]}


def _stop_actor(ray: Any, handle: Any, timeout: float = 180.0) -> dict[str, Any]:
    try:
        result = ray.get(handle.shutdown.remote(), timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - an actor already dead: nothing of it runs any more
        result = {"stopped": False, "error": f"{type(exc).__name__}: {exc}"}
    ray.kill(handle, no_restart=True)
    return result


def down(address: str | None, timeout: float = 180.0) -> dict[str, Any]:
    ray = ray_env.connect(address)
    handles = ray_env.actors(ray)
    # An actor that cannot describe itself within 10 s runs no agent (dead, or waiting to be
    # restarted on a node that is gone): kill it without waiting on a shutdown it cannot run.
    answering = {d["node_id"] for d in ray_env.members(timeout=10.0, handles=handles)}
    refs = {name: h.shutdown.remote() for name, h in handles.items() if name in answering}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout) if refs else ([], [])
    out: list[dict[str, Any]] = []
    for name, handle in handles.items():
        ref = refs.get(name)
        if ref is None:
            result: dict[str, Any] = {"stopped": False, "error": "the node's actor did not answer (node gone?)"}
        elif ref not in ready:
            result = {"stopped": False, "error": f"shutdown did not finish within {timeout:.0f}s"}
        else:
            try:
                result = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - dead actor: its agent died with it (PDEATHSIG)
                result = {"stopped": False, "error": f"{type(exc).__name__}: {exc}"}
        ray.kill(handle, no_restart=True)
        out.append({"node_id": name, **result})
    return {"stopped": sorted(out, key=lambda d: d["node_id"])}
