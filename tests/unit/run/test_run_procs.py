"""procs: tree kill with stop-then-kill, start-time identity, reaping only our zombies."""

from __future__ import annotations

import os
import subprocess
import time

from rollstack.run.procs import ProcRef, descendants, kill_tree, reap, ref


def test_kill_tree_kills_every_descendant():
    # sh -> (sleep, sh -> sleep): a two-level tree of long sleeps
    p = subprocess.Popen(["sh", "-c", "sleep 300 & sh -c 'sleep 301 & wait' & wait"])
    try:
        for _ in range(100):
            if len(descendants(p.pid)) >= 3:
                break
            time.sleep(0.02)
        tree = descendants(p.pid)
        assert len(tree) >= 3
        killed = kill_tree(ref(p.pid))
        assert {r.pid for r in killed} >= {p.pid, *tree}
        assert p.wait(5) == -9
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    for _ in range(100):
        if all(ref(pid) is None or open(f"/proc/{pid}/stat").read().split(") ")[1][0] == "Z"
               for pid in tree):
            break
        time.sleep(0.02)


def test_stale_refs_are_not_signalled_or_reaped():
    p = subprocess.Popen(["sleep", "300"])
    try:
        r = ref(p.pid)
        assert r is not None
        impostor = ProcRef(p.pid, r.start + 1)  # same pid, another process
        assert kill_tree(impostor) == []
        assert p.poll() is None  # untouched
        os.kill(p.pid, 9)
        time.sleep(0.1)
        assert reap([impostor]) == 0  # start time differs: not ours to reap
        assert reap([r]) == 1
        assert ref(p.pid) is None
    finally:
        if p.poll() is None:
            p.kill()
        try:
            p.wait(1)
        except ChildProcessError:
            pass
