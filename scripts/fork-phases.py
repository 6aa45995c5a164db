"""Where a fork's time goes, per phase, for fork(1) and fork(8), in one process.

    PYTHONPATH=src .venv/bin/python scripts/fork-phases.py [IMAGE|""] [REPS] [THREADS]

An in-process node over IMAGE (default: the python-project bench image); a parent writes 1,000
x 10 KiB, three forks make the image's layer hot and the node's background work is waited for,
then REPS (default 11) quiet forks of 1 and of 8, the late-bound pool full and nothing being
destroyed before each. Prints each fork's p50 and, per phase, the p50 over the forks of the sum
of that phase's calls (several calls of one phase may run at once on the bind threads: their
sum can exceed the fork's time), and the fork's own group timings (`timings.group`).
THREADS (e.g. "1,2,4"): the bind threads' count cycles through these, fork by fork, and the
p50 per count is printed too.
"""

from __future__ import annotations

import collections
import functools
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

from rollstack import Node
from rollstack.node import fanout, recovery, service, stages, warm
from rollstack.run import lateroot, overlay
from rollstack_bench.fork import _image_store

IMAGE = "oci:/var/cache/rollstack/bench-images/python-project:latest"
PHASES: list[tuple[Any, str]] = [
    (service.NodeService, "_create"), (stages.Stages, "fork_source"), (stages.Stages, "bind_late"),
    (fanout, "_begin_all"), (fanout, "_build_all"), (lateroot, "_claim"), (lateroot, "_mount"),
    (lateroot, "_switch"), (overlay, "mount_overlay"), (recovery, "save_record"), (warm, "handout"),
]
GROUP = ("fork_pause_s", "fork_copy_s", "late_bind", "begin")
spent: dict[str, float] = collections.defaultdict(float)


def timed(owner: Any, name: str) -> None:
    real: Callable[..., Any] = getattr(owner, name)
    label = f"{getattr(owner, '__name__', owner)}.{name}".split(".", 2)[-1]

    @functools.wraps(real)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - t

    setattr(owner, name, wrapper)


def main() -> None:
    image = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else IMAGE
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 11
    threads = [int(t) for t in sys.argv[3].split(",")] if len(sys.argv) > 3 else []
    for owner, name in PHASES:
        timed(owner, name)
    work = Path("/var/tmp/rollstack-fork-phases")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    store, plan = _image_store(image, work, print)
    with Node(store=store, root=work / "node", max_environments=24) as node:
        svc = node.service
        parent = node.create(plan)
        parent.exec(["/bin/sh", "-c", "mkdir -p d && i=0; while [ $i -lt 1000 ]; do "
                     "head -c 10240 /dev/urandom > d/f$i; i=$((i+1)); done"], timeout=600)
        for _ in range(3):
            for kid in parent.fork(count=1):
                kid.destroy()
        lw = svc.stages.lowers
        for idle in (lw.erofs, lw.materializer):
            if idle is not None:
                idle.wait_idle(600)
        for n in (1, 8):
            totals: list[float] = []
            phases: dict[str, list[float]] = collections.defaultdict(list)
            by_threads: dict[int, list[float]] = collections.defaultdict(list)
            for rep in range(reps):
                svc.wait_destroyed(300)
                svc.stages.late.wait_full(120)
                if threads:
                    lateroot.MOUNT_THREADS = threads[rep % len(threads)]
                    if lateroot._MOUNTERS is not None:
                        lateroot._MOUNTERS.shutdown()
                        lateroot._MOUNTERS = None
                spent.clear()
                t = time.perf_counter()
                kids = parent.fork(count=n)
                totals.append(time.perf_counter() - t)
                by_threads[lateroot.MOUNT_THREADS].append(totals[-1])
                for label, s in spent.items():
                    phases[label].append(s)
                group = kids[0].created.timings.group or {}
                for key in GROUP:
                    if key in group:
                        phases[f"group.{key}"].append(group[key])
                for kid in kids:
                    kid.destroy()
            print(f"fork({n}) p50 {statistics.median(totals) * 1000:.1f} ms over {reps}")
            for label, values in sorted(phases.items()):
                print(f"  {label}: {statistics.median(values) * 1000:.2f} ms")
            if threads:
                for count, values in sorted(by_threads.items()):
                    print(f"  {count} bind threads: {statistics.median(values) * 1000:.1f} ms over {len(values)}")
        parent.destroy()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
