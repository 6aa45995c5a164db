"""The lazy store's node-wide statistics document (`GET /v1/stats`) and Prometheus gauges."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollstack.lazystore.service import LazyStoreService


def fuse_ops(svc: "LazyStoreService") -> dict[str, int]:
    """FUSE requests served, by operation; `getxattr_fast`: xattr requests answered by the
    patched pyfuse3 in C (not counted under `getxattr`); `fast_drained`: requests processed
    right after another without a trip through the event loop (see `fuse_linger_us`)."""
    fs = svc.frontend
    if fs is None:
        return {}
    ops = dict(fs.ops)
    fast = fs.fast_stats()
    if fast is not None:
        ops["getxattr_fast"] = int(fast["xattr_fast_replies"])
        ops["fast_drained"] = int(fast["drained"])  # processed without a trip through trio
    return ops


def node_stats(svc: "LazyStoreService") -> dict[str, Any]:
    peers, shared = svc.peers, svc.traces.shared
    return {
        "layers": len(svc.layers),
        "environments": len(svc.envs.envs),
        "open_files": len(svc.reads.files),
        "unopened_read_states": len(svc.reads.unopened),
        "memory_cache": {"bytes": svc.memory.bytes, "budget": svc.memory.budget, "chunks": len(svc.memory)},
        "disk_cache": {"bytes": svc.disk.bytes, "budget": svc.disk.budget, "chunks": len(svc.disk),
                       "evictions": svc.disk.evictions, "rejected": svc.disk.rejected,
                       **svc.fetcher.writeback_queue()},
        "peers": {"urls": list(peers.urls if peers else svc.config.peers),
                  "hits": peers.hits if peers else 0, "misses": peers.misses if peers else 0},
        "fetch": svc.metrics.snapshot(),
        "background": svc.fetcher.gate.snapshot(),
        "fuse_ops": fuse_ops(svc),
        "fuse_mode": dict(svc.frontend.mode) if svc.frontend is not None else {},
        "shared_trace_hits": shared["hits"], "shared_trace_misses": shared["misses"],
        "shared_trace_errors": shared["errors"], "shared_traces_published": shared["published"],
        "shared_trace_publish_errors": shared["publish_errors"],
        "uptime_seconds": round(time.time() - svc.started, 3),
    }


def update_gauges(svc: "LazyStoreService") -> None:
    svc.metrics.cache_bytes.labels("memory").set(svc.memory.bytes)
    svc.metrics.cache_bytes.labels("disk").set(svc.disk.bytes)
