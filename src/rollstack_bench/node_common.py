"""Helpers the node benchmarks share (`bench node` and its parts: node_fanout, node_wrk,
node_containerd; `bench env` waits on destroys with them): the node under test, its CPU,
latency summaries, bursts, settling."""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

SMALL = {"cpu": 0.1, "memory": "64Mi", "max_cpu": 1, "max_memory": "256Mi"}
IMAGE = "docker.io/rollstack/bench-busybox:1"


def _log(msg: str) -> None:
    print(f"[bench node] {msg}", file=sys.stderr, flush=True)


def _pct(values: list[float], q: float) -> float:
    from rollstack.core.stats import percentile

    return round(percentile(values, q), 6) if values else float("nan")


def _lat(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": _pct(values, 50), "p99": _pct(values, 99)}


def _cpu(pids: list[int]) -> float:
    """CPU seconds of `pids` including their reaped children (utime+stime+cutime+cstime)."""
    tck, total = os.sysconf("SC_CLK_TCK"), 0
    for pid in pids:
        try:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in f[11:15])
        except (OSError, IndexError, ValueError):
            pass
    return total / tck


def _node(base: Path, name: str, spec: str, **extra: Any) -> tuple[Any, int]:
    from rollstack.node import agent
    from rollstack.node.config import NodeConfig
    from rollstack.node.server import free_port

    config = NodeConfig(root=base / name, listen=f"127.0.0.1:{free_port()}", store=spec,
                        max_environments=256, **extra)
    return config, agent.start(config)["pid"]


def _burst(one: Callable[[int], float], size: int) -> dict[str, Any]:
    lat: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        try:
            v = one(i)
            with lock:
                lat.append(v)
        except Exception as e:  # noqa: BLE001 - counted and reported
            with lock:
                failures.append(f"{type(e).__name__}: {e}"[:300])

    t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=size) as pool:
        list(pool.map(run, range(size)))
    wall = time.perf_counter() - t
    return {"size": size, "seconds": round(wall, 3), "envs_per_s": round(len(lat) / wall, 2),
            "first_exec": _lat(lat), "failures": len(failures), "errors": failures[:3]}


def _pending_destroys(client: Any) -> int:
    for line in client._service.metrics_text().splitlines():
        if line.startswith("rollstack_destroys_pending "):
            return int(float(line.split()[1]))
    return 0


def wait_destroys_drained(client: Any, timeout: float = 600.0) -> None:
    """Until the node has no background destroy pending (at most `timeout` seconds)."""
    end = time.monotonic() + timeout
    while _pending_destroys(client) and time.monotonic() < end:
        time.sleep(0.05)


def _metric(client: Any, name: str) -> float:
    for line in client._service.metrics_text().splitlines():
        if line.startswith(f"rollstack_{name} "):
            return float(line.split()[1])
    return 0.0


def settle(client: Any, warm: int, timeout: float = 300.0) -> float:
    """Until the node is idle again: background destroys done and, with a warm pool, the pool
    refilled (the idle time between two GRPO iterations). Returns the seconds waited."""
    t = time.perf_counter()
    wait_destroys_drained(client, timeout)
    end = time.monotonic() + timeout
    while warm and _metric(client, "warm_latest_ready") < warm and time.monotonic() < end:
        time.sleep(0.05)
    return round(time.perf_counter() - t, 3)
