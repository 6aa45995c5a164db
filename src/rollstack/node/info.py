"""`node_info(service)`: the `GET /v1/node` document a cluster pool places by.

Capacity left is the provisioner's admission view (capacity minus committed start quotas: what
`admit` would still accept) and the admission slots left; hot layers are the layers of
environments this agent ran (loaded in its lazy store) plus the materialized ones; groups count
live environments per trace key (the task: stack + mutation), so a GRPO group can be kept together.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rollstack.node import record as st
from rollstack.contract.models import NodeInfo


def instance_of(service: Any) -> str:
    return f"{os.getpid()}-{int(getattr(service, 'started_at', 0.0) * 1e6)}"


def _loaded_layers(layers_dir: Path) -> list[str]:
    """Layers the lazy store has loaded (its `layers/` directory lists them by hex digest)."""
    try:
        return [f"sha256:{name}" for name in os.listdir(layers_dir) if len(name) == 64]
    except OSError:
        return []


def node_info(service: Any) -> NodeInfo:
    from rollstack.fetch.traces import trace_keys

    cfg = service.config
    with service._lock:  # noqa: SLF001 - a read-only snapshot of the registry
        recs = list(service._envs.values())  # noqa: SLF001
    live = [r for r in recs if r.state in st.LIVE_STATES]
    groups: dict[str, int] = {}
    hot: set[str] = set(_loaded_layers(cfg.lazy_dir / "mnt" / "layers"))
    for rec in live:
        for ref in rec.refs:
            hot.add(ref.digest)
        created = rec.created
        key, _ = trace_keys(created.stack_digest if created else None, rec.plan)
        if key and not rec.internal:
            groups[key] = groups.get(key, 0) + 1
    stages = service.stages
    if stages is not None and stages.lowers is not None:
        hot.update(stages.lowers.local_layers())
    capacity: dict[str, float] = {"slots": float(cfg.max_environments)}
    free: dict[str, float] = {"slots": float(max(0, cfg.max_environments - len(live)))}
    provisioner = stages.provisioner if stages is not None else None
    if provisioner is not None:
        c = provisioner.committed()
        capacity.update(cpu=float(c["capacity_cpu"]), memory=float(c["capacity_memory"]))
        free.update(cpu=max(0.0, float(c["capacity_cpu"]) - float(c["cpu"])),
                    memory=float(max(0, int(c["capacity_memory"]) - int(c["memory"]))))
    else:
        cpu, mem = float(cfg.capacity_cpu or os.cpu_count() or 1), float(cfg.capacity_memory or 1 << 40)
        capacity.update(cpu=cpu, memory=mem)
        free.update(cpu=cpu, memory=mem)
    return NodeInfo(
        instance=instance_of(service),
        environments=len(live),
        env_ids=[r.id for r in live if not r.internal],
        capacity=capacity,
        free=free,
        hot_layers=sorted(hot),
        groups=groups,
        status="stopping" if service._stopping.is_set() else "ok",  # noqa: SLF001
    )
