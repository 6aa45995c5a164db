"""`rollstack bench fork`: branching a running environment, measured on a real node.

An in-process node (`rollstack.Node`: lazy store, overlayfs, runc) over the busybox corpus
(`bench env`'s), or over an image (`--image`, imported first; commands run in /root). A parent environment writes a diff (`--files` files of `--file-kib` KiB each:
10 MB in 1,000 files by default, then one `--big-mib` MiB file), and is forked:
- `fork(1)` and `fork(8)` latency as the caller sees it (p50 over `--reps`), with the node's own
  split: the parent's pause (the cut), the copy of its upper, and the slowest child's start
  (its root switch on a late-bound sandbox, else its `runc run`) and how many children took a
  late-bound sandbox; each fork right after the previous one's children were destroyed (their
  teardowns running beside it and the pool refilling, as in an RL loop), again on a quiet node
  (waiting for them, for the pool and for the layers' background extraction and EROFS builds
  that the image's first use started; the time waited for those is `settle_s`), and again with
  every child a cold start (the pool set aside), side by side;
- the same quiet forks of a parent with a network (`expose`: its own namespace, veth and table,
  set up after each late-bound child's bind), and all cold;
- bare `runc run -d` of a static init, 1 and 8 at once (the floor of cold starts on this node);
- the same with the big diff;
- `create(count=8)` beside `create()` of the same plan, the cost a fork replaces;
- `--cycles` fork/destroy cycles, then what is left under the node root (must be nothing);
- the parent's `exec true` p50 while nothing else runs, right after the cuts (the children's
  teardowns still running beside it) and once they are done (what the cuts left on the parent);
- `pause()` / `resume()` p50 through the SDK (in-process node), and `pause("checkpoint")` /
  `resume()` with a process running in the parent (CRIU; its dump size; that it goes on);
- `snapshot()` of the parent with both diffs, then a second node with an empty root over the same
  store creating from it (cold) and running a first exec;
- a task whose setup burns `--setup-seconds` of CPU: its group of `--group` with the setup run
  once and forked (`create(plan, count)` with `setup`) vs created one by one, each running it.
Goals (issue 37): fork(1) p50 <= 100 ms with 10 MB / 1,000 files, <= 1 s with 100 MB; fork(8)
<= 1.5x fork(1); the cycles leave nothing; resume <= 50 ms; the snapshot published in <= 2 s and
a fresh node started from it in <= 1 s.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any, Iterator

import typer


def _p50(xs: list[float]) -> float:
    return round(median(xs), 4) if xs else 0.0


def _fork_times(parent: Any, count: int, reps: int, quiet: Any = None) -> dict[str, Any]:
    """`parent.fork(count)` `reps` times, the children checked and destroyed after each; with
    `quiet` (the node), each fork waits until the node has nothing else to do: the previous
    children's teardowns done, the late-bound pool refilled, the layers' background extraction
    and EROFS builds finished (the first use of an image on a node starts them)."""
    wall, pause, copy, memory, start, warm = [], [], [], [], [], []
    settle = 0.0
    for _ in range(reps):
        if quiet is not None:
            quiet.service.wait_destroyed(300)
            lowers = quiet.service.stages.lowers
            if lowers is not None:
                t = time.perf_counter()
                lowers.wait_idle(600)
                settle += time.perf_counter() - t
            late = quiet.service.stages.late
            if late is not None:
                late.wait_full(120)  # and the late-bound sandboxes refilled
        t = time.perf_counter()
        kids = parent.fork(count)
        wall.append(time.perf_counter() - t)
        timings = kids[0].created.timings if kids[0].created else None
        group = (timings.group or {}) if timings else {}
        start.append(max((k.created.timings.start or 0.0) for k in kids if k.created) if timings else 0.0)
        pause.append(float(group.get("fork_pause_s", 0.0)))
        copy.append(float(group.get("fork_copy_s", 0.0)))
        memory.append(float(group.get("fork_in_memory", 0.0)))
        warm.append(sum(bool(k.created and k.created.timings.warm) for k in kids))
        for k in kids:
            assert k.exec(["cat", "marker"]).stdout == "cut\n", "a child lost the parent's state"
            k.destroy()
    return {"count": count, "reps": reps, "p50_s": _p50(wall), "max_s": round(max(wall), 4),
            "pause_p50_s": _p50(pause), "copy_p50_s": _p50(copy), "child_start_p50_s": _p50(start),
            "layers_in_memory": f"{sum(m > 0 for m in memory)}/{len(memory)}",
            "late_bound_children": f"{sum(warm)}/{count * reps}", "settle_s": round(settle, 2)}


def _runc_floor(work: Path, reps: int) -> dict[str, Any]:
    """What cold starts alone cost: bare `runc run -d` of a container holding nothing but a
    static init (rollstack-execd without its socket: a zombie reaper), 1 and 8 at once, with
    none of rollstack around it (no overlay, no user namespace, no quotas). A fork's children are
    such starts plus rollstack's own steps, so fork(8) / fork(1) cannot go below this ratio by
    much with cold starts."""
    import shutil
    from concurrent.futures import ThreadPoolExecutor

    from rollstack.run.initbin import find_execd

    init = find_execd()
    if init is None or shutil.which("runc") is None:
        return {"skipped": "no runc or rollstack-execd"}
    bundle, state = work / "floor", work / "floor-state"
    (bundle / "rootfs").mkdir(parents=True)
    shutil.copy(init, bundle / "rootfs" / "init")
    subprocess.run(["runc", "spec"], cwd=bundle, check=True)
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"].update(args=["/init"], terminal=False)
    spec["root"]["readonly"] = True
    (bundle / "config.json").write_text(json.dumps(spec))

    def runc(*args: str) -> None:
        # no pipe of ours: the container's init inherits runc's stdio and would hold it open
        subprocess.run(["runc", "--root", str(state), "--log", str(work / "floor.log"), *args], check=True,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    out: dict[str, Any] = {}
    with ThreadPoolExecutor(8) as pool:
        for n in (1, 8):
            walls = []
            for r in range(reps):
                names = [f"rollstack-floor-{n}-{r}-{i}" for i in range(n)]
                t = time.perf_counter()
                try:
                    list(pool.map(lambda name: runc("run", "-d", "--bundle", str(bundle), name), names))
                    walls.append(time.perf_counter() - t)
                finally:
                    for name in names:
                        subprocess.run(["runc", "--root", str(state), "delete", "-f", name],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(0.2)
            out[f"run_{n}_p50_s"] = _p50(walls)
    out["run_8_over_run_1"] = round(out["run_8_p50_s"] / out["run_1_p50_s"], 2)
    out["left"] = sorted(p.name for p in state.iterdir()) if state.is_dir() else []
    return out


@contextlib.contextmanager
def _on_disk(node: Any) -> Iterator[None]:
    """Fork layers go to the node's disk meanwhile (NodeConfig.fork_memory's tmpfs unused)."""
    forks = node.service.stages.forks
    memory, forks.memory = forks.memory, 0
    try:
        yield
    finally:
        forks.memory = memory


@contextlib.contextmanager
def _cold_children(node: Any) -> Iterator[None]:
    """Forks' children start cold meanwhile (the late-bound pool set aside, still refilling)."""
    stages = node.service.stages
    late, stages.late = stages.late, None
    try:
        yield
    finally:
        stages.late = late


def _network_forks(node: Any, plan: dict[str, Any], reps: int) -> dict[str, Any]:
    """Quiet forks of a parent with a network (`expose`: a namespace, a veth, a table; no
    traffic), its children on late-bound sandboxes and then all cold, side by side."""
    parent = node.create({**plan, "expose": [8080]})
    try:
        parent.exec(["/bin/sh", "-c", "echo cut > marker"])
        out = {"fork_1": _fork_times(parent, 1, reps, quiet=node),
               "fork_8": _fork_times(parent, 8, max(2, reps // 3), quiet=node)}
        with _cold_children(node):
            out["cold_fork_8"] = _fork_times(parent, 8, max(2, reps // 3), quiet=node)
        return out
    finally:
        parent.destroy()


def _exec_p50(env: Any, n: int = 20) -> float:
    xs = []
    for _ in range(n):
        t = time.perf_counter()
        env.exec(["true"])
        xs.append(time.perf_counter() - t)
    return _p50(xs)


def _checkpoints(node: Any, parent: Any, reps: int) -> dict[str, Any]:
    """`pause("checkpoint")` / `resume()` of the parent with a process running in it (CRIU dumps
    and restores it, and the exec agent with it); the parent's `exec true` before and after."""
    from rollstack.run.checkpoint import find_criu

    if find_criu() is None:
        return {"skipped": "no CRIU (make setup builds it)"}
    parent.exec(["/bin/sh", "-c", "setsid sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/bench-count; "
                 "sleep 0.05; done' </dev/null >/dev/null 2>&1 &"])
    before = _exec_p50(parent)
    pauses, resumes, sizes = [], [], []
    for _ in range(reps):
        t = time.perf_counter()
        parent.pause("checkpoint")
        t1 = time.perf_counter()
        sizes.append(next(e.get("bytes", 0.0) for e in reversed(node.service._get(parent.id).events)
                          if e["type"] == "paused"))
        parent.resume()
        pauses.append(t1 - t)
        resumes.append(time.perf_counter() - t1)
    def count() -> int:  # the loop truncates and rewrites the file: an empty read is retried
        for _ in range(100):
            if text := parent.read_file("/tmp/bench-count").decode().strip():
                return int(text)
            time.sleep(0.01)
        return -1

    first, deadline = count(), time.monotonic() + 10
    while (now := count()) <= first and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = now > first
    return {"pause_p50_s": _p50(pauses), "resume_p50_s": _p50(resumes), "dump_bytes_p50": _p50(sizes),
            "reps": reps, "process_goes_on": alive,
            "exec_p50_before_s": before, "exec_p50_after_restore_s": _exec_p50(parent)}


def _snapshot_and_restore(parent: Any, store: str, root2: Path, log: Any) -> dict[str, Any]:
    """The parent (its whole diff: the small files and the big one) published as a snapshot,
    then started on a second node with an empty root over the same store: cold (nothing of it
    in that node's lazy store or page of its own), create and first exec as the caller sees them."""
    from rollstack import Node

    t = time.perf_counter()
    snap = parent.snapshot("bench/fork:snap1")
    publish_s = time.perf_counter() - t
    log(f"[bench fork] snapshot published in {publish_s:.2f} s ({snap.bytes} bytes stored)")
    out: dict[str, Any] = {"publish_s": round(publish_s, 4), "node_seconds": snap.seconds, "files": snap.files,
                           "stored_bytes": snap.bytes}
    with Node(store=store, root=root2, max_environments=4) as other:
        t = time.perf_counter()
        env = other.create(snap.plan)
        created = time.perf_counter() - t
        try:
            r = env.exec(["/bin/sh", "-c", "cat marker && wc -c < big.bin"], timeout=120)
            first_exec = time.perf_counter() - t
            out.update(cold_create_s=round(created, 4), cold_create_and_exec_s=round(first_exec, 4),
                       restored=r.exit_code == 0 and r.stdout.startswith("cut\n"))
        finally:
            env.destroy()
    return out


def _setup_iteration(node: Any, plan: dict[str, Any], seconds: int, group: int) -> dict[str, Any]:
    """A task whose setup is `seconds` of one core's work (a shell loop, calibrated here): its group of `group` created with the
    setup run once and forked (`create(count=group)`) vs created one by one in parallel, each
    running the setup (what a driver without fork does); every member then runs one command."""
    from concurrent.futures import ThreadPoolExecutor

    loop = "i=0; while [ $i -lt {n} ]; do i=$((i+1)); done"
    probe = node.create(plan)  # calibrate: a fixed amount of work that takes `seconds` on an idle core
    try:
        t = time.perf_counter()
        probe.exec(["/bin/sh", "-c", loop.format(n=200_000)], timeout=600)
        n = int(200_000 * seconds / max(time.perf_counter() - t, 1e-3))
    finally:
        probe.destroy()
    burn = loop.format(n=n) + "; echo done > setup.ok"
    p = {**plan, "setup": [burn], "setup_timeout": seconds * 20 + 60}
    t = time.perf_counter()
    envs = node.create(p, group)
    for e in envs:
        assert e.exec(["cat", "setup.ok"]).stdout == "done\n"
    once = time.perf_counter() - t
    for e in envs:
        e.destroy()
    t = time.perf_counter()
    with ThreadPoolExecutor(group) as pool:
        envs = list(pool.map(lambda _: node.create(p), range(group)))
    for e in envs:
        assert e.exec(["cat", "setup.ok"]).stdout == "done\n"
    every = time.perf_counter() - t
    for e in envs:
        e.destroy()
    return {"setup_seconds": seconds, "group": group, "loop_iterations": n, "setup_once_then_fork_s": round(once, 2),
            "setup_in_every_rollout_s": round(every, 2), "speedup": round(every / once, 2) if once else 0.0}


IMAGE_GROUP = "bench/fork-image:1"


def _image_store(image: str, work: Path, log: Any) -> tuple[str, dict[str, Any]]:
    """`image` imported into a fresh OCI layout store; a plan over it (its commands in /root)."""
    from rollstack.plan.imports import import_image
    from rollstack.store import open_store

    spec = f"oci:{work / 'store'}"
    store = open_store(spec)
    try:
        log(f"[bench fork] importing {image}")
        import_image(image, IMAGE_GROUP, store, cache_dir=work / "import-cache", work_dir=work)
    finally:
        store.close()
    return spec, {"name": "fork-image", "groups": [IMAGE_GROUP], "workdir": "/root", "timeout": 3600,
                  "env": {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}}


def run(files: int, file_kib: int, big_mib: int, reps: int, cycles: int, work: Path, command: str,
        log: Any = print, setup_seconds: int = 0, group: int = 4, image: str | None = None) -> dict[str, Any]:
    from rollstack import Node
    from rollstack.node.forks import layer_names
    from rollstack_bench.env import busybox_plan, publish_busybox_corpus
    from rollstack_bench.report import machine_facts

    if image:
        store, plan = _image_store(image, work, log)
    else:
        store, plan = publish_busybox_corpus(work / "store", work / "build"), busybox_plan()
    root = work / "node"
    doc: dict[str, Any] = {"command": command, "image": image or "busybox corpus", "machine": machine_facts(),
                           "diff": {"files": files, "file_kib": file_kib, "big_mib": big_mib}}
    with Node(store=store, root=root, max_environments=24) as node:
        parent = node.create(plan)
        try:
            doc["parent_exec_p50_s"] = _exec_p50(parent)
            parent.exec(["/bin/sh", "-c", f"echo cut > marker && mkdir -p d && i=0; while [ $i -lt {files} ]; do "
                         f"head -c {file_kib * 1024} /dev/urandom > d/f$i; i=$((i+1)); done"], timeout=600)
            log(f"[bench fork] parent wrote {files} x {file_kib} KiB")
            doc["small"] = {"fork_1": _fork_times(parent, 1, reps), "fork_8": _fork_times(parent, 8, max(2, reps // 3))}
            doc["small_quiet"] = {"fork_1": _fork_times(parent, 1, reps, quiet=node),
                                  "fork_8": _fork_times(parent, 8, max(2, reps // 3), quiet=node)}
            with _cold_children(node):  # the same forks with every child a cold start, side by side
                doc["small_cold"] = {"fork_1": _fork_times(parent, 1, reps, quiet=node),
                                     "fork_8": _fork_times(parent, 8, max(2, reps // 3), quiet=node)}
            doc["network"] = _network_forks(node, plan, reps)
            with _on_disk(node):  # the same cuts with the fork store's tmpfs off, side by side
                doc["small_on_disk"] = {"fork_1": _fork_times(parent, 1, reps),
                                        "fork_8": _fork_times(parent, 8, max(2, reps // 3))}
            doc["parent_exec_after_cuts_p50_s"] = _exec_p50(parent)  # the children's teardowns still run
            node.service.wait_destroyed(300)
            doc["parent_exec_after_cuts_quiet_p50_s"] = _exec_p50(parent)
            parent.exec(["/bin/sh", "-c", f"head -c {big_mib << 20} /dev/urandom > big.bin"], timeout=600)
            log(f"[bench fork] parent wrote {big_mib} MiB more")
            doc["big"] = {"fork_1": _fork_times(parent, 1, max(2, reps // 3))}
            with _on_disk(node):
                doc["big_on_disk"] = {"fork_1": _fork_times(parent, 1, max(2, reps // 3))}
            doc["snapshot"] = _snapshot_and_restore(parent, store, work / "node2", log)
            t = time.perf_counter()
            for _ in range(cycles):
                for k in parent.fork(1):
                    k.destroy()
            doc["cycles"] = {"n": cycles, "seconds": round(time.perf_counter() - t, 2)}
            pauses, resumes = [], []
            for _ in range(reps):
                t = time.perf_counter()
                parent.pause()
                t1 = time.perf_counter()
                parent.resume()
                pauses.append(t1 - t)
                resumes.append(time.perf_counter() - t1)
            doc["pause_resume"] = {"pause_p50_s": _p50(pauses), "resume_p50_s": _p50(resumes), "reps": reps}
            doc["checkpoint"] = _checkpoints(node, parent, max(2, reps // 3))
        finally:
            parent.destroy()
        one, eight = [], []
        for _ in range(max(2, reps // 3)):
            t = time.perf_counter()
            node.create(plan).destroy()
            one.append(time.perf_counter() - t)
            t = time.perf_counter()
            for e in node.create(plan, 8):
                e.destroy()
            eight.append(time.perf_counter() - t)
        doc["create"] = {"create_1_p50_s": _p50(one), "create_8_p50_s": _p50(eight), "note": "create + destroy"}
        if setup_seconds:
            log(f"[bench fork] a group of {group} with a {setup_seconds} s setup, once vs in every rollout")
            doc["setup"] = _setup_iteration(node, plan, setup_seconds, group)
        node.service.wait_destroyed(300)
        doc["left_after_cycles"] = layer_names(root / "forks")
    try:
        doc["runc_floor"] = _runc_floor(work, max(3, reps))
    except (OSError, subprocess.CalledProcessError) as e:  # the rest of the document stands
        doc["runc_floor"] = {"skipped": f"bare runc failed: {e}"}
    small, big = doc["small"], doc["big"]
    ratio = small["fork_8"]["p50_s"] / small["fork_1"]["p50_s"] if small["fork_1"]["p50_s"] else 0.0
    doc["fork_8_over_fork_1"] = round(ratio, 2)
    quiet = doc["small_quiet"]
    doc["fork_8_over_fork_1_quiet"] = round(quiet["fork_8"]["p50_s"] / quiet["fork_1"]["p50_s"], 2) \
        if quiet["fork_1"]["p50_s"] else 0.0
    cold = doc["small_cold"]
    doc["fork_8_over_fork_1_cold"] = round(cold["fork_8"]["p50_s"] / cold["fork_1"]["p50_s"], 2) \
        if cold["fork_1"]["p50_s"] else 0.0
    doc["goals"] = {
        "fork_1_small_le_100ms": small["fork_1"]["p50_s"] <= 0.1,
        "fork_1_big_le_1s": big["fork_1"]["p50_s"] <= 1.0,
        "fork_8_le_1_5x_fork_1": ratio <= 1.5,
        "fork_8_le_1_5x_fork_1_quiet": doc["fork_8_over_fork_1_quiet"] <= 1.5,
        "cycles_leave_nothing": doc["left_after_cycles"] == [],
        "resume_le_50ms": doc["pause_resume"]["resume_p50_s"] <= 0.05,
        "snapshot_publish_le_2s": doc["snapshot"]["publish_s"] <= 2.0,
        "cross_node_cold_start_le_1s": doc["snapshot"]["cold_create_s"] <= 1.0 and doc["snapshot"]["restored"],
    }
    return doc


def _human(doc: dict[str, Any]) -> None:
    s, b = doc["small"], doc["big"]
    d = doc["diff"]
    print(f"diff {d['files']} x {d['file_kib']} KiB: fork(1) p50 {s['fork_1']['p50_s'] * 1e3:.0f} ms "
          f"(pause {s['fork_1']['pause_p50_s'] * 1e3:.0f} ms, copy {s['fork_1']['copy_p50_s'] * 1e3:.0f} ms), "
          f"fork(8) p50 {s['fork_8']['p50_s'] * 1e3:.0f} ms ({doc['fork_8_over_fork_1']}x); children on late-bound "
          f"sandboxes {s['fork_1']['late_bound_children']} and {s['fork_8']['late_bound_children']}")
    q, cd = doc["small_quiet"], doc["small_cold"]
    print(f"on a quiet node (the previous children's teardowns done, the pool refilled, the layers' "
          f"background work done after {q['fork_1']['settle_s'] + q['fork_8']['settle_s']:.1f} s): fork(1) p50 "
          f"{q['fork_1']['p50_s'] * 1e3:.0f} ms, fork(8) p50 {q['fork_8']['p50_s'] * 1e3:.0f} ms "
          f"({doc['fork_8_over_fork_1_quiet']}x); every child cold: {cd['fork_1']['p50_s'] * 1e3:.0f} ms, "
          f"{cd['fork_8']['p50_s'] * 1e3:.0f} ms ({doc['fork_8_over_fork_1_cold']}x)")
    nw = doc["network"]
    print(f"children with a network (expose), quiet: fork(1) p50 {nw['fork_1']['p50_s'] * 1e3:.0f} ms, fork(8) "
          f"{nw['fork_8']['p50_s'] * 1e3:.0f} ms on late-bound sandboxes ({nw['fork_8']['late_bound_children']}), "
          f"{nw['cold_fork_8']['p50_s'] * 1e3:.0f} ms all cold")
    fl = doc["runc_floor"]
    if "skipped" not in fl:
        print(f"bare runc run -d of a static init: 1 p50 {fl['run_1_p50_s'] * 1e3:.0f} ms, 8 at once "
              f"{fl['run_8_p50_s'] * 1e3:.0f} ms ({fl['run_8_over_run_1']}x: the cold starts' own floor)")
    print(f"+{d['big_mib']} MiB: fork(1) p50 {b['fork_1']['p50_s'] * 1e3:.0f} ms (copy {b['fork_1']['copy_p50_s'] * 1e3:.0f} ms)")
    sd, bd = doc["small_on_disk"], doc["big_on_disk"]
    print(f"layers on disk instead of the tmpfs: fork(1) p50 {sd['fork_1']['p50_s'] * 1e3:.0f} ms "
          f"(copy {sd['fork_1']['copy_p50_s'] * 1e3:.0f} ms), fork(8) {sd['fork_8']['p50_s'] * 1e3:.0f} ms; "
          f"+{d['big_mib']} MiB {bd['fork_1']['p50_s'] * 1e3:.0f} ms")
    sn = doc["snapshot"]
    print(f"snapshot of it published in {sn['publish_s']:.2f} s; a fresh node starts from it in {sn['cold_create_s']:.2f} s "
          f"(+ first exec {sn['cold_create_and_exec_s']:.2f} s; restored: {sn['restored']})")
    c = doc["create"]
    print(f"create(1) {c['create_1_p50_s'] * 1e3:.0f} ms, create(count=8) {c['create_8_p50_s'] * 1e3:.0f} ms (with destroy)")
    print(f"parent exec true p50 {doc['parent_exec_p50_s'] * 1e3:.1f} ms, right after the cuts "
          f"{doc['parent_exec_after_cuts_p50_s'] * 1e3:.1f} ms, once their children are gone "
          f"{doc['parent_exec_after_cuts_quiet_p50_s'] * 1e3:.1f} ms")
    pr = doc["pause_resume"]
    print(f"pause p50 {pr['pause_p50_s'] * 1e3:.1f} ms, resume p50 {pr['resume_p50_s'] * 1e3:.1f} ms (through the SDK)")
    ck = doc["checkpoint"]
    if "skipped" not in ck:
        print(f"checkpoint (CRIU) p50 {ck['pause_p50_s'] * 1e3:.0f} ms ({ck['dump_bytes_p50'] / 2**20:.1f} MiB dumped), "
              f"restore p50 {ck['resume_p50_s'] * 1e3:.0f} ms; its process goes on: {ck['process_goes_on']}; "
              f"exec true p50 {ck['exec_p50_before_s'] * 1e3:.1f} ms before, "
              f"{ck['exec_p50_after_restore_s'] * 1e3:.1f} ms after (the agent restored with it)")
    if "setup" in doc:
        su = doc["setup"]
        print(f"group of {su['group']} with a {su['setup_seconds']} s CPU setup: once + fork {su['setup_once_then_fork_s']} s, "
              f"in every rollout {su['setup_in_every_rollout_s']} s ({su['speedup']}x)")
    print(f"{doc['cycles']['n']} fork/destroy cycles in {doc['cycles']['seconds']} s; left: {doc['left_after_cycles'] or 'nothing'}")
    print("goals: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in doc["goals"].items()))


def register(app: typer.Typer) -> None:
    @app.command("fork")
    def fork_bench(
        files: int = typer.Option(1000, "--files", min=1, help="files in the parent's diff"),
        file_kib: int = typer.Option(10, "--file-kib", min=1, help="KiB per file"),
        big_mib: int = typer.Option(100, "--big-mib", min=1, help="MiB of the big diff (one file, added)"),
        reps: int = typer.Option(9, "--reps", min=3, help="fork(1) samples (fork(8): a third)"),
        cycles: int = typer.Option(100, "--cycles", min=0, help="fork/destroy cycles at the end"),
        setup_seconds: int = typer.Option(20, "--setup-seconds", min=0, help="CPU seconds of the setup step (0: skip that part)"),
        group: int = typer.Option(4, "--group", min=2, max=16, help="group size for the setup comparison"),
        image: str = typer.Option("", "--image", help="run on this image (oci:DIR[:TAG], docker://...) instead of the busybox corpus"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
    ) -> None:
        """Fork latency (1 and 8 children) on a 10 MB / 1,000-file and a 100 MB diff; cycles leave nothing."""
        command = " ".join(["rollstack", *sys.argv[1:]]) if sys.argv[1:2] == ["bench"] else "rollstack bench fork"
        with tempfile.TemporaryDirectory(prefix="rollstack-bench-fork-", dir="/var/tmp") as tmp:
            doc = run(files, file_kib, big_mib, reps, cycles, Path(tmp), command,
                      log=lambda m: print(m, file=sys.stderr), setup_seconds=setup_seconds, group=group,
                      image=image or None)
        if as_json:
            print(json.dumps(doc, indent=2))
        else:
            _human(doc)
        raise typer.Exit(0 if all(doc["goals"].values()) else 1)
