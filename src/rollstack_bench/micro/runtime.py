"""Latency of the runtime's primitives on this host: `python -m rollstack_bench.micro.runtime`.

Measures, over N environments on a busybox lower (or the lower dirs given): overlay mount,
`runc run -d` (start), create = mount + start, `exec true` (runc exec round trip through the
full wrapper), `runc exec ID /bin/true` alone (runc's own cost, for comparison), `runc update`
of cpu+memory, destroy. Also reports the load average, since the host may be shared. Prints one JSON document with p50/p95 per
phase, the machine facts and the command. Needs root. The node's `rollstack bench env` measures
the same through the HTTP API.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from rollstack.run.environment import EnvironmentRuntime, RuntimeConfig
from rollstack.run.ocispec import SpecParams


def busybox_lower(dst: Path, busybox: str = "/bin/busybox") -> Path:
    (dst / "bin").mkdir(parents=True)
    shutil.copy2(busybox, dst / "bin" / "busybox")
    for applet in subprocess.run([busybox, "--list"], capture_output=True, text=True,
                                 check=True).stdout.split():
        if applet != "busybox":
            os.symlink("busybox", dst / "bin" / applet)
    return dst


def _summary(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"p50_ms": round(1000 * statistics.median(xs), 2),
            "p95_ms": round(1000 * xs[min(len(xs) - 1, int(0.95 * len(xs)))], 2),
            "n": len(xs)}


def measure(root: Path, lowers: list[Path], envs: int = 10, execs: int = 20) -> dict:
    rt = EnvironmentRuntime(RuntimeConfig(root=root))
    t: dict[str, list[float]] = {k: [] for k in
                                 ("mount", "start", "create", "exec_true", "runc_exec_raw", "update",
                                  "destroy")}
    for i in range(envs):
        env_id = f"m-{uuid.uuid4().hex[:10]}"
        t0 = time.monotonic()
        env = rt.create(env_id, lowers, SpecParams(env_id, cpu=1, memory=256 << 20))
        t["create"].append(time.monotonic() - t0)
        t["mount"].append(env.timings["mount"])
        t["start"].append(env.timings["start"])
        try:
            for _ in range(execs):
                t1 = time.monotonic()
                r = env.exec(["true"])
                t["exec_true"].append(time.monotonic() - t1)
                assert r.exit_code == 0
            for _ in range(execs):  # the same without our wrapper or pipes: runc's own cost
                t1 = time.monotonic()
                subprocess.run(rt.runc._cmd("exec", env_id, "/bin/true"), check=True,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
                t["runc_exec_raw"].append(time.monotonic() - t1)
            for j in range(5):
                t1 = time.monotonic()
                env.update(cpu=0.5 + j * 0.25, memory=(256 + 64 * j) << 20)
                t["update"].append(time.monotonic() - t1)
        finally:
            t1 = time.monotonic()
            env.destroy()
            t["destroy"].append(time.monotonic() - t1)
    return {k: _summary(v) for k, v in t.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--envs", type=int, default=10)
    ap.add_argument("--execs", type=int, default=20)
    ap.add_argument("--lower", action="append", type=Path, help="lower dir (top first); "
                    "default: a fresh busybox root")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rs-measure-") as tmp:
        lowers = args.lower or [busybox_lower(Path(tmp) / "busybox")]
        result = measure(Path(tmp) / "rt", lowers, args.envs, args.execs)
    runc_version = subprocess.run(["runc", "--version"], capture_output=True,
                                  text=True).stdout.splitlines()[0]
    doc = {"phases": result,
           "machine": {"kernel": platform.release(), "cpus": os.cpu_count(),
                       "loadavg": os.getloadavg(),
                       "runc": runc_version, "python": platform.python_version()},
           "command": "python -m rollstack_bench.micro.runtime " + " ".join(sys.argv[1:] if argv is None
                                                                   else argv)}
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
