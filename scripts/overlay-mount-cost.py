"""What one overlay mount costs on this node's disk, by syscall: fresh upper/work dirs, then the
same after a global sync.

    PYTHONPATH=src .venv/bin/python scripts/overlay-mount-cost.py [MOUNTS]

Makes MOUNTS (default 40) sets of upper/work/target dirs under /var/tmp, mounts an overlay of
two small lowers on each (rollstack.run.overlay.mount_overlay: fsopen, fsconfig..., the
superblock's creation, fsmount, move_mount), times each syscall, unmounts; then again on new
dirs after `sync`. The superblock's creation (fsconfig CMD_CREATE) makes and removes overlay's
work and test inodes in the work dir: it is nearly all of a mount, and how long it takes depends
on what the disk is still doing (docs/benchmarks.md, "Where a fork of 8 spends its time").
"""

from __future__ import annotations

import collections
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rollstack.host import libc
from rollstack.run import overlay

NAMES = {v: k.removeprefix("_SYS_").lower() for k, v in vars(overlay).items() if k.startswith("_SYS_")}


def run(base: Path, mounts: int, sync: bool) -> None:
    lowers = [base / "low1", base / "low2"]
    for i, low in enumerate(lowers):
        low.mkdir(exist_ok=True)
        (low / f"f{i}").write_text("x\n")
    sets = []
    for i in range(mounts):
        d = base / f"{'synced' if sync else 'fresh'}{i}"
        for sub in ("upper", "work", "root"):
            (d / sub).mkdir(parents=True)
        sets.append(d)
    if sync:
        os.sync()
    calls: dict[str, list[float]] = collections.defaultdict(list)
    real = libc.syscall

    def timed(nr: int, *args: Any) -> Any:
        t = time.perf_counter()
        try:
            return real(nr, *args)
        finally:
            name = NAMES.get(nr, str(nr))
            if name == "fsconfig":
                name += " create" if args[1].value == overlay._FSCONFIG_CMD_CREATE else " set"
            calls[name].append(time.perf_counter() - t)

    totals = []
    libc.syscall = timed
    try:
        for d in sets:
            t = time.perf_counter()
            overlay.mount_overlay(lowers, d / "upper", d / "work", d / "root")
            totals.append(time.perf_counter() - t)
    finally:
        libc.syscall = real
        for d in sets:
            libc.umount2(d / "root", 0)
    label = "after sync" if sync else "fresh dirs"
    print(f"{label}: mount p50 {statistics.median(totals) * 1000:.2f} ms, max {max(totals) * 1000:.2f} ms")
    for name, values in sorted(calls.items()):
        print(f"  {name}: p50 {statistics.median(values) * 1000:.3f} ms x {len(values) // mounts} per mount")


def main() -> None:
    mounts = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    base = Path("/var/tmp/rollstack-overlay-mount-cost")
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    try:
        run(base, mounts, sync=False)
        run(base, mounts, sync=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
