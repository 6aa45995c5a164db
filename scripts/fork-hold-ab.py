"""A/B of a fork's hold on the node's background work (host.foreground), in one process.

    PYTHONPATH=src .venv/bin/python scripts/fork-hold-ab.py [IMAGE] [FORKS]

An in-process node over IMAGE (default: the python-project bench image); a parent writes 1,000
x 10 KiB, then FORKS forks of 8 (default 24), the late-bound pool refilled before each, with
the hold on and off in turn (`Lowers.hold` replaced by a no-op for the "off" arm). The first
forks make the image's layer hot, so its background extraction runs beside them for a while:
the rows say, per fork, whether a background process was registered (stopped by the "on" arm).
Prints the p50 of each arm over the forks that ran beside the extraction and over the others.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from rollstack import Node
from rollstack_bench.fork import _image_store

IMAGE = "oci:/var/cache/rollstack/bench-images/python-project:latest"


def main() -> None:
    image = sys.argv[1] if len(sys.argv) > 1 else IMAGE
    forks = int(sys.argv[2]) if len(sys.argv) > 2 else 24
    work = Path("/var/tmp/rollstack-fork-hold-ab")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    store, plan = _image_store(image, work, print)
    rows: dict[tuple[str, bool], list[float]] = {}
    with Node(store=store, root=work / "node", max_environments=24) as node:
        stages = node.service.stages
        lowers = stages.lowers
        parent = node.create(plan)
        parent.exec(["/bin/sh", "-c", "mkdir -p d && i=0; while [ $i -lt 1000 ]; do "
                     "head -c 10240 /dev/urandom > d/f$i; i=$((i+1)); done"], timeout=600)
        for i in range(forks):
            node.service.wait_destroyed(300)
            stages.late.wait_full(120)
            arm = "on" if i % 2 else "off"
            if arm == "off":
                lowers.hold = contextlib.nullcontext  # type: ignore[method-assign]
            else:
                lowers.__dict__.pop("hold", None)
            beside = bool(lowers.foreground._fds)
            t = time.perf_counter()
            kids = parent.fork(count=8)
            ms = (time.perf_counter() - t) * 1000
            for k in kids:
                k.destroy()
            rows.setdefault((arm, beside), []).append(ms)
            print(f"fork(8) #{i:2d} hold {arm:3s} beside background work: {'yes' if beside else 'no '} {ms:6.1f} ms")
        parent.destroy()
    for (arm, beside), xs in sorted(rows.items()):
        print(f"hold {arm:3s} beside background {'yes' if beside else 'no '}: p50 {statistics.median(xs):.1f} ms over {len(xs)}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
