"""Synthetic bursty workloads run as real processes inside a cgroup (tests and `bench elastic`).

A workload is a list of steps executed by a tiny standalone Python script (no rollstack import,
`python -S`, ~7 MiB): `{"sleep": s}`, `{"burn": cpu_s, "procs": k, "duty": d}` (k forked busy
processes, each burning cpu_s CPU-seconds, busy a fraction d of each 10 ms slice),
`{"alloc": mib, "rate": mib_per_s}` (mmap and touch every page, kept until `free` or exit),
`{"free": true}`, `{"read": path}` (read a file through the page cache). The process waits for a line on stdin before starting, so the parent can move
it into its cgroup first; its children inherit the cgroup.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from rollstack.provision.backend import CgroupBackend

SCRIPT = r"""
import json, mmap, os, sys, time
steps = json.loads(sys.argv[1])
sys.stdin.readline()
held = []
def burn(cpu_s, duty):
    end = time.process_time() + cpu_s
    busy, idle = 0.01 * duty, 0.01 * (1 - duty)
    while time.process_time() < end:
        t = time.perf_counter() + busy
        while time.perf_counter() < t:
            pass
        if idle > 0:
            time.sleep(idle)
for st in steps:
    if "sleep" in st:
        time.sleep(st["sleep"])
    elif "burn" in st:
        kids = []
        for _ in range(st.get("procs", 1)):
            pid = os.fork()
            if pid == 0:
                burn(st["burn"], st.get("duty", 1.0))
                os._exit(0)
            kids.append(pid)
        for pid in kids:
            _, status = os.waitpid(pid, 0)
            if status != 0:
                sys.exit(3)
    elif "alloc" in st:
        total = int(st["alloc"] * 1048576)
        rate = st.get("rate") or 0
        chunk = 8 * 1048576
        t0 = time.perf_counter()
        done = 0
        while done < total:
            n = min(chunk, total - done)
            m = mmap.mmap(-1, n)
            for i in range(0, n, 4096):
                m[i] = 1
            held.append(m)
            done += n
            if rate:
                ahead = done / (rate * 1048576) - (time.perf_counter() - t0)
                if ahead > 0:
                    time.sleep(ahead)
    elif "read" in st:
        with open(st["read"], "rb", buffering=0) as f:
            while f.read(1 << 20):
                pass
    elif st.get("free"):
        for m in held:
            m.close()
        held.clear()
"""


class WorkloadProcess:
    """One running workload in a cgroup."""

    def __init__(self, backend: CgroupBackend, cgroup_path: str, steps: list[dict[str, Any]]) -> None:
        self.steps = steps
        self.proc = subprocess.Popen(
            [sys.executable, "-S", "-c", SCRIPT, json.dumps(steps)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            backend.add_proc(cgroup_path, self.proc.pid)
        except BaseException:
            self.kill()
            raise
        self.started = time.monotonic()
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.close()
        self.ended: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        rc = self.proc.poll()
        if rc is not None and self.ended is None:
            self.ended = time.monotonic()
        return rc

    def wait(self, timeout: float | None = None) -> int:
        rc = self.proc.wait(timeout)
        self.poll()
        return rc

    @property
    def elapsed(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def kill(self) -> None:
        """SIGKILL the whole process group (the workload and its forked burners)."""
        try:
            os.killpg(self.proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        self.poll()
