"""The Ray actor of one environment node: a detached, named actor pinned to its Ray node.

    rollstack-node-<ray node id[:12]>   in namespace "rollstack"

It runs a `HostAgent` (node agent + lazy store daemon as subprocesses of this actor's worker, see
`rollstack.cluster.host`). Ray gives membership (named actors), liveness and restarts
(`max_restarts=-1`: a crashed actor comes back on the same node, with the same root and ports, and
its agent's recovery cleans what the dead one left). Being detached and named, `status`/`down`
and pools in other processes find the actors by listing the namespace.

Ray is imported only here (and in `rollstack.cluster.ray_env`): the rest of rollstack never needs it.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from rollstack.cluster.ray_env import NAMESPACE, PREFIX, RESOURCE, actor_name, members

class NodeActor:
    """The actor body (wrapped by `ray.remote` in `remote_class()`)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import ray

        from rollstack.cluster.host import HostAgent

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        ctx = ray.get_runtime_context()
        self.ray_node_id = ctx.get_node_id()
        self.name = actor_name(self.ray_node_id)
        # A raylet started with ROLLSTACK_NETNS/ROLLSTACK_NODE_IP (bench cluster's per-node
        # network namespaces, rollstack_bench.cluster_net) runs its agent in that namespace.
        netns = os.environ.get("ROLLSTACK_NETNS") or None
        host = (os.environ.get("ROLLSTACK_NODE_IP") if netns else None) or spec.get("host") \
            or ray.util.get_node_ip_address()
        self._lock = threading.Lock()
        self.agent = HostAgent(self.name.removeprefix(PREFIX), spec["root"], spec["store"], host, spec["token"],
                               options=spec.get("options") or {}, peers=self._peer_urls, netns=netns,
                               start_timeout=float(spec.get("start_timeout", 120.0)))
        self.spec = spec
        self.agent.start()

    def describe(self) -> dict[str, Any]:
        doc = self.agent.describe()
        doc.update(node_id=self.name, ray_node_id=self.ray_node_id, token=self.spec["token"],
                   store=self.spec["store"])
        return doc

    def _peer_urls(self) -> list[str]:
        return [m["lazy_url"] for m in members(timeout=2.0) if m.get("state") == "running" and m["node_id"] != self.name]

    def sync_peers(self) -> list[str] | None:
        return self.agent.sync_peers()

    def shutdown(self) -> dict[str, Any]:
        with self._lock:
            return self.agent.stop(remove=True)


def remote_class() -> Any:
    import ray

    return ray.remote(NodeActor)


def start_actor(ray: Any, ray_node_id: str, spec: dict[str, Any]) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return remote_class().options(
        name=actor_name(ray_node_id), namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
        max_restarts=-1, max_task_retries=0, max_concurrency=4, num_cpus=0, resources={RESOURCE: 0.001},
        scheduling_strategy=NodeAffinitySchedulingStrategy(ray_node_id, soft=False),
    ).remote(spec)
