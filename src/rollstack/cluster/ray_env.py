"""Talking to the Ray cluster: connect (with a clear error for a wrong address), list the node
actors and their documents, start and stop them. Everything Ray-specific but the actor itself.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from rollstack.errors import ClusterUnavailable, InvalidRequest

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0
NAMESPACE = "rollstack"
PREFIX = "rollstack-node-"
RESOURCE = "rollstack"


def actor_name(ray_node_id: str) -> str:
    return PREFIX + ray_node_id[:12]


def _check_reachable(address: str) -> None:
    """Fail fast (and clearly) on an address nothing listens at: ray.init would wait a minute."""
    if address in ("auto", "local") or address.startswith("ray://"):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise InvalidRequest(f"Ray address {address!r} is not HOST:PORT (the head's GCS address)")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT):
            pass
    except OSError as exc:
        raise ClusterUnavailable(f"no Ray cluster at {address}: {exc.strerror or exc}", address=address) from None


def connect(address: str | None) -> Any:
    """`ray` connected to the cluster at `address` (HOST:PORT of the head; default $RAY_ADDRESS)."""
    import ray

    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise InvalidRequest("give the Ray cluster's address (--address HOST:PORT or $RAY_ADDRESS)")
    _check_reachable(address)
    try:
        ray.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING, log_to_driver=False,
                 ignore_reinit_error=True)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterUnavailable(f"cannot join the Ray cluster at {address}: {exc}", address=address) from None
    return ray


def rollstack_nodes(ray: Any) -> list[dict[str, Any]]:
    """Alive Ray nodes that carry the custom resource `rollstack`."""
    return [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get(RESOURCE, 0) > 0]


def actors(ray: Any) -> dict[str, Any]:
    """name -> handle of every rollstack node actor in the namespace."""
    out: dict[str, Any] = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        name = entry["name"] if isinstance(entry, dict) else entry
        ns = entry.get("namespace") if isinstance(entry, dict) else NAMESPACE
        if ns == NAMESPACE and name.startswith(PREFIX):
            try:
                out[name] = ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:  # gone between the listing and the lookup
                continue
    return out


def members(timeout: float = 5.0, handles: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The `describe()` document of every node actor that answers within `timeout` s."""
    import ray

    handles = actors(ray) if handles is None else handles
    refs = {name: h.describe.remote() for name, h in handles.items()}
    if not refs:
        return []
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)
    ready_set = set(ready)
    out: list[dict[str, Any]] = []
    for name, ref in refs.items():
        if ref not in ready_set:
            continue
        try:
            out.append(ray.get(ref))
        except Exception as exc:  # noqa: BLE001 - an actor that died or is restarting: not a member now
            log.info("node actor %s did not describe itself: %s", name, exc)
    return sorted(out, key=lambda d: d["node_id"])
