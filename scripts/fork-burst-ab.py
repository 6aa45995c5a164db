"""Bursts of forks, as a GRPO iteration makes them, with and without the late-bound pool's growth.

    PYTHONPATH=src .venv/bin/python scripts/fork-burst-ab.py [IMAGE|""] [ITERATIONS] [PARENTS]

An in-process node over IMAGE (default: the python-project bench image) with the default pool
of 8 late-bound sandboxes; PARENTS (default 4) parents, each with a 1,000-file diff. Each
iteration forks 8 children from every parent, one fork right after the other (a burst of
8 x PARENTS children), destroys them 3 s later (the rollouts), and waits for the teardowns.
Arms, one node each, alternating: "grows" (`fork_warm_max` 32: the pool grows by the children
a burst left cold) and "fixed" (`fork_warm_max` 8). Prints per arm and iteration the forks'
p50 and the children that took a late-bound sandbox; the first iteration is the node's first
burst in both arms.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import time
from pathlib import Path

from rollstack import Node
from rollstack_bench.fork import _image_store

IMAGE = "oci:/var/cache/rollstack/bench-images/python-project:latest"
DIFF = "mkdir -p d && i=0; while [ $i -lt 1000 ]; do head -c 10240 /dev/urandom > d/f$i; i=$((i+1)); done"


def arm(name: str, store: Path, plan: object, work: Path, grow_to: int, iterations: int, parents: int) -> None:
    root = work / f"node-{name}"
    shutil.rmtree(root, ignore_errors=True)
    with Node(store=store, root=root, max_environments=8 * parents + parents + 40, fork_warm=8,
              fork_warm_max=grow_to) as node:
        svc = node.service
        envs = [node.create(plan) for _ in range(parents)]
        for env in envs:
            env.exec(["/bin/sh", "-c", DIFF], timeout=600)
        for kid in envs[0].fork(count=1):  # the node's first fork: the pool starts filling
            kid.destroy()
        svc.stages.late.wait_full(120)
        for it in range(iterations):
            times, warm, kids = [], 0, []
            for env in envs:
                t = time.perf_counter()
                got = env.fork(count=8)
                times.append(time.perf_counter() - t)
                warm += sum(bool(k.created.timings.warm) for k in got)
                kids += got
            time.sleep(3.0)
            for kid in kids:
                kid.destroy()
            svc.wait_destroyed(300)
            size = svc.metrics()["fork_warm_size"]
            print(f"{name} iteration {it + 1}: fork(8) p50 {statistics.median(times) * 1000:.1f} ms, "
                  f"max {max(times) * 1000:.1f} ms, late-bound {warm}/{8 * parents}, pool size {size:.0f}",
                  flush=True)
            svc.stages.late.wait_full(120)
        for env in envs:
            env.destroy()
    shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    image = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else IMAGE
    iterations = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    parents = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    work = Path("/var/tmp/rollstack-fork-burst-ab")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    store, plan = _image_store(image, work, print)
    try:
        for name, grow_to in (("grows", 32), ("fixed", 8), ("grows", 32), ("fixed", 8)):
            arm(name, store, plan, work, grow_to, iterations, parents)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
