"""`rollstack bench node`'s containerd side: `ctr task exec` and `ctr run --rm` bursts in a
private containerd, over the busybox tree as a one-layer OCI image (and `--image`)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from rollstack_bench.node_common import IMAGE, _burst, _cpu, _lat
from rollstack_bench.systems.containerd import oci_archive


def _containerd_pids(state: Path) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if str(state).encode() in cmd or b"containerd-shim" in cmd and b"rs-bench" in cmd:
                out.append(int(d.name))
    return out


def measure(base: Path, tree: Path, execs: int, burst: int, bursts: int,
                image: str | None = None) -> dict[str, Any]:
    from rollstack_bench.systems.containerd import PrivateContainerd, available

    why = available()
    if why:
        return {"skipped": why}
    state = Path(tempfile.mkdtemp(prefix="rs-ctrd-", dir="/tmp"))
    try:
        with PrivateContainerd(state) as ctr:
            archive = base / "busybox-oci.tar"
            oci_archive(tree, archive, IMAGE)
            ctr.run("images", "import", "--snapshotter", "overlayfs", str(archive))
            ctr.run("run", "-d", "--snapshotter", "overlayfs", IMAGE, "rs-exec", "sleep", "100000")
            lat = []
            pids = _containerd_pids(state)
            cpu0 = _cpu(pids) + _cpu([os.getpid()])
            for i in range(execs):
                t = time.perf_counter()
                ctr.run("tasks", "exec", "--exec-id", f"x{i}", "rs-exec", "true")
                lat.append(time.perf_counter() - t)
            cpu = _cpu(pids) + _cpu([os.getpid()]) - cpu0  # ctr clients are our reaped children
            ctr.run("tasks", "kill", "-s", "SIGKILL", "rs-exec", check=False)
            ctr.delete("rs-exec")

            def runner(name: str) -> Callable[[int], float]:
                def one(i: int) -> float:
                    t = time.perf_counter()
                    cid = f"b{i}-{time.monotonic_ns()}"
                    ctr.run("run", "--rm", "--snapshotter", "overlayfs", name, cid, "true")
                    return time.perf_counter() - t
                return one

            runs = [_burst(runner(IMAGE), burst) for _ in range(bursts)]
            out = {"exec_true": {**_lat(lat), "cpu_per_exec_s": round(cpu / execs, 6)}, "bursts": runs}
            if image:
                from rollstack_bench.node_image import CTR_NAME, layout_archive

                ctr.run("images", "import", "--snapshotter", "overlayfs", str(layout_archive(image, base)))
                ctr.run("run", "--rm", "--snapshotter", "overlayfs", CTR_NAME, "warmup", "true")
                out["image_bursts"] = [_burst(runner(CTR_NAME), burst) for _ in range(bursts)]
            return out
    finally:
        shutil.rmtree(state, ignore_errors=True)


