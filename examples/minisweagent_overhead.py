#!/usr/bin/env python3
"""Per-action overhead of the mini-swe-agent environment: create one, run `true` N times, destroy.

    python examples/minisweagent_overhead.py --plan /tmp/plan.yaml [--n 40]

Node and token default to $ROLLSTACK_NODE / $ROLLSTACK_TOKEN / the node's token file.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", required=True)
    ap.add_argument("--n", type=int, default=40)
    args = ap.parse_args()
    from rollstack.integrations.minisweagent import RollstackEnvironment

    t0 = time.perf_counter()
    env = RollstackEnvironment(plan=args.plan, timeout=30)
    create = time.perf_counter() - t0
    node_create = env.env.created.timings.total if env.env.created else float("nan")
    lat = []
    try:
        for _ in range(args.n):
            t = time.perf_counter()
            env.execute({"command": "true"})
            lat.append(time.perf_counter() - t)
    finally:
        env.cleanup()
    lat.sort()
    p95 = lat[max(0, int(0.95 * len(lat)) - 1)]
    print(f"create {create:.3f}s (node {node_create:.3f}s); execute('true') p50 "
          f"{statistics.median(lat) * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms (n={len(lat)}); "
          f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
