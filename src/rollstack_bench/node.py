"""`rollstack bench node`: node throughput side by side with containerd, in one run.

A real agent (`rollstack node start` in a temporary root, loopback port) over the busybox corpus
(`bench env`'s), measured through the SDK over HTTP:
- `exec true`: p50/p99 latency and node CPU per exec (the agent process and the children it
  reaps), with the in-sandbox agent and with `runc exec` (a second node, `exec_agent=False`);
  containerd: `ctr task exec` into a running task (CPU of ctr + containerd + its shims);
- exec throughput: `--callers` threads, one environment each, `exec true` for `--seconds`; and
  the same load from wrk (`--callers` keep-alive connections; rollstack_bench.node_wrk), whose
  CPU per request is ~20x below the SDK's, so the figure is the node's
  (latency and throughput use the corpus plan's 0.5-core environments: at 0.1 core, back-to-back
  execs are CFS-throttled until the provisioner grows the quota);
- GRPO fan-out: create(count=8) + one exec each vs one create + exec;
- bursts: `--burst` concurrent create -> `exec true` -> destroy through one shared `Client`,
  `--bursts` times (environments/s as the callers see them, and counting the wait until the
  node's background destroys are done; create->first-exec p50/p99, failures), vs `--burst`
  concurrent `ctr run --rm IMAGE true` of the same tree imported into a private containerd;
- admission: how many small environments (0.1 core, 64 MiB) the node admits.
Goals (issue 16): exec p50 <= 5 ms, <= 3 ms node CPU per exec, >= 500 execs/s; fan-out of 8 <=
1.5x one; bursts >= 3x containerd, p99 <= 3x p50, no failures.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any, Callable

import typer

from rollstack_bench.node_common import (SMALL, _burst, _cpu, _lat, _log, _metric, _node, _pct, _pending_destroys, settle, wait_destroys_drained)


# -- rollstack ---------------------------------------------------------------------------------


def _exec_latency(client: Any, plan: dict[str, Any], n: int, pid: int) -> dict[str, Any]:
    with client.create(plan) as env:
        for _ in range(20):
            env.exec(["true"])
        cpu0, lat = _cpu([pid]), []
        for _ in range(n):
            t = time.perf_counter()
            env.exec(["true"])
            lat.append(time.perf_counter() - t)
        cpu = _cpu([pid]) - cpu0
    return {**_lat(lat), "node_cpu_per_exec_s": round(cpu / n, 6)}


def _throughput(client: Any, plan: dict[str, Any], callers: int, seconds: float) -> dict[str, Any]:
    envs = client.create(plan, count=callers)
    try:
        stop, counts = time.monotonic() + seconds, [0] * callers

        def loop(i: int) -> None:
            while time.monotonic() < stop:
                envs[i].exec(["true"])
                counts[i] += 1

        t = time.perf_counter()
        with ThreadPoolExecutor(max_workers=callers) as pool:
            list(pool.map(loop, range(callers)))
        wall = time.perf_counter() - t
    finally:
        for e in envs:
            e.destroy()
    return {"callers": callers, "execs": sum(counts), "execs_per_s": round(sum(counts) / wall, 1)}


def _throughput_wrk(client: Any, config: Any, plan: dict[str, Any], connections: int,
                    seconds: float, pid: int) -> dict[str, Any]:
    """The same load from wrk (rollstack_bench.node_wrk): the node's figure without the
    Python client's CPU on the same 2 cores."""
    from rollstack_bench import node_wrk

    envs = client.create(plan, count=connections)
    try:
        return node_wrk.measure(config.url(), config.token_path.read_text().strip(), [e.id for e in envs],
                                connections, seconds, [pid], lambda: _metric(client, "execs_total"))
    finally:
        for e in envs:
            e.destroy()


def _fanout(client: Any, plan: dict[str, Any], count: int, rounds: int, warm: int = 0,
            pids: list[int] | None = None) -> dict[str, Any]:
    """One vs a group of `count`: create only and create + exec (rollstack_bench.node_fanout)."""
    from rollstack_bench.node_fanout import measure

    return measure(client, plan, count, rounds, warm, pids or [])


def _drained_burst(client: Any, plan: dict[str, Any], size: int, warm: int = 0) -> dict[str, Any]:
    """A burst, then the wait until the node's background destroys of it are done: the burst's
    environments/s as the caller sees them, and counting the cleanup (what `ctr run --rm` pays).
    With a warm pool, the node is first given the time to refill it (`settle_seconds`)."""
    settled = settle(client, warm)
    hits = _metric(client, "warm_hits_total")
    t = time.perf_counter()
    doc = _burst(_rollstack_burst(client, plan), size)
    doc["destroys_pending_at_end"] = _pending_destroys(client)
    wait_destroys_drained(client)
    wall = time.perf_counter() - t
    doc["drained_seconds"] = round(wall, 3)
    doc["drained_envs_per_s"] = round(doc["first_exec"]["n"] / wall, 2)
    doc["settle_seconds"], doc["warm_hits"] = settled, int(_metric(client, "warm_hits_total") - hits)
    return doc


def _rollstack_burst(client: Any, plan: dict[str, Any]) -> Callable[[int], float]:
    def one(_: int) -> float:
        t = time.perf_counter()
        env = client.create(plan)
        try:
            if env.exec(["true"]).exit_code != 0:
                raise RuntimeError("exec true failed")
            return time.perf_counter() - t
        finally:
            env.destroy()
    return one


def _admitted(client: Any, plan: dict[str, Any], limit: int) -> int:
    """Small environments admitted at once (stops at `limit`)."""
    from rollstack.errors import InsufficientCapacity

    envs = []
    try:
        while len(envs) < limit:
            try:
                envs += client.create(plan, count=min(16, limit - len(envs)))
            except InsufficientCapacity:
                break
        return len(envs)
    finally:
        for e in envs:
            e.destroy()


# -- the benchmark -----------------------------------------------------------------------------

def run_bench(execs: int, callers: int, seconds: float, fanout: int, burst: int, bursts: int,
              containerd: bool, warm: int = 0, image: str | None = None,
              fanout_rounds: int = 5) -> dict[str, Any]:
    from rollstack_bench.env import build_busybox_trees, busybox_plan, publish_busybox_corpus
    from rollstack_bench.report import current_command, machine_facts
    from rollstack.client import Client
    from rollstack.node import agent

    base = Path(tempfile.mkdtemp(prefix="rs-bench-node-", dir="/var/tmp"))
    configs = []
    doc: dict[str, Any] = {}
    try:
        _log("publishing the busybox corpus")
        spec = publish_busybox_corpus(base / "store", base / "build")
        plan = busybox_plan(resources=SMALL)  # bursts, fan-out, admission: agent-sized
        busy = busybox_plan()  # exec latency/throughput: 0.5 core (a 0.1-core env is throttled)
        if image:
            from rollstack_bench import node_image

            _log(f"importing {image}")
            doc["image"] = node_image.import_group(image, spec, base)
        pool = {"warm_pool": warm, "warm_pool_max": max(64, warm)} if warm else {}
        for mode, extra in (("agent", pool), ("runc", {"exec_agent": False})):
            config, pid = _node(base, f"node-{mode}", spec, **extra)
            configs.append(config)
            with Client(config.url(), token=config.token_path.read_text().strip()) as client:
                client.create(plan).destroy()  # warm caches
                _log(f"{mode}: exec true x{execs}")
                part: dict[str, Any] = {"exec_true": _exec_latency(client, busy, execs, pid)}
                if mode == "agent":
                    _log(f"throughput: {callers} callers for {seconds}s")
                    part["throughput"] = _throughput(client, busy, callers, seconds)
                    _log(f"throughput: wrk, {callers} connections for {seconds}s")
                    part["throughput_wrk"] = _throughput_wrk(client, config, busy, callers, seconds, pid)
                    from rollstack_bench.node_fanout import node_pids, other_mode

                    _log(f"fan-out of {fanout}")
                    part["fanout"] = _fanout(client, plan, fanout, rounds=fanout_rounds, warm=warm,
                                             pids=node_pids(config, pid))
                    _log(f"fan-out of {fanout}, warm pool {'off' if warm else 'on'} (a node of its own)")
                    doc["fanout_other"] = other_mode(base, spec, plan, fanout, fanout_rounds, warm)
                    _log(f"{bursts} bursts of {burst}")
                    part["bursts"] = [_drained_burst(client, plan, burst, warm) for _ in range(bursts)]
                    if image:
                        from rollstack_bench.node_image import image_plan

                        _log(f"image: fan-out of {fanout}, {bursts} bursts of {burst}")
                        iplan = image_plan(SMALL)
                        client.create(iplan).destroy()
                        settle(client, 0)
                        doc["image"]["fanout"] = _fanout(client, iplan, fanout, rounds=5, warm=warm)
                        doc["image"]["bursts"] = [_drained_burst(client, iplan, burst, warm)
                                                  for _ in range(bursts)]
                    settle(client, 0)
                    part["admitted_small_envs"] = _admitted(client, plan, limit=96)
            doc[mode] = part
            agent.stop(config)
            configs.remove(config)
        if containerd:
            _log("containerd: ctr task exec, ctr run --rm bursts")
            tree = build_busybox_trees(base / "ctr-tree")["os"]
            from rollstack_bench.node_containerd import measure

            doc["containerd"] = measure(base, tree, min(execs, 100), burst, bursts, image)
        doc["warm_pool"] = warm
        doc["summary"] = _summary(doc)
        doc["machine"], doc["command"] = machine_facts(), current_command()
        return doc
    finally:
        for config in configs:
            agent.stop(config)
        shutil.rmtree(base, ignore_errors=True)


def _summary(doc: dict[str, Any]) -> dict[str, Any]:
    a = doc["agent"]
    ours = [b["envs_per_s"] for b in a["bursts"]]
    drained = [b["drained_envs_per_s"] for b in a["bursts"]]
    out: dict[str, Any] = {
        "burst_drained_envs_per_s_p50": _pct(drained, 50),
        "exec_p50_ms": round(a["exec_true"]["p50"] * 1e3, 2),
        "exec_node_cpu_ms": round(a["exec_true"]["node_cpu_per_exec_s"] * 1e3, 2),
        "runc_exec_p50_ms": round(doc["runc"]["exec_true"]["p50"] * 1e3, 2),
        "runc_exec_node_cpu_ms": round(doc["runc"]["exec_true"]["node_cpu_per_exec_s"] * 1e3, 2),
        "execs_per_s": a["throughput"]["execs_per_s"],
        **({"execs_per_s_wrk": a["throughput_wrk"]["execs_per_s"],
            "exec_node_cpu_ms_wrk": round(a["throughput_wrk"]["node_cpu_per_exec_s"] * 1e3, 2),
            "exec_failures_wrk": a["throughput_wrk"]["failures"]} if "throughput_wrk" in a else {}),
        "fanout_ratio": a["fanout"]["ratio"],
        **_fanout_summary(doc),
        "burst_envs_per_s_p50": _pct(ours, 50),
        "burst_p99_over_p50": round(max(b["first_exec"]["p99"] / b["first_exec"]["p50"]
                                        for b in a["bursts"]), 2),
        "burst_failures": sum(b["failures"] for b in a["bursts"]),
        "admitted_small_envs": a["admitted_small_envs"],
    }
    out["warm_pool"] = doc.get("warm_pool", 0)
    c = doc.get("containerd") or {}
    img = doc.get("image") or {}
    if img.get("bursts"):
        mine = [b["envs_per_s"] for b in img["bursts"]]
        out["image_fanout_ratio"] = img["fanout"]["ratio"]
        out["image_burst_envs_per_s_p50"] = _pct(mine, 50)
        out["image_burst_failures"] = sum(b["failures"] for b in img["bursts"])
        if c.get("image_bursts"):
            theirs = [b["envs_per_s"] for b in c["image_bursts"]]
            out["containerd_image_burst_envs_per_s_p50"] = _pct(theirs, 50)
            out["image_burst_vs_containerd"] = round(_pct(mine, 50) / _pct(theirs, 50), 2)
    if c.get("bursts"):
        theirs = [b["envs_per_s"] for b in c["bursts"]]
        out["containerd_burst_envs_per_s_p50"] = _pct(theirs, 50)
        out["burst_vs_containerd"] = round(_pct(ours, 50) / _pct(theirs, 50), 2)
        out["burst_drained_vs_containerd"] = round(_pct(drained, 50) / _pct(theirs, 50), 2)
        out["containerd_exec_p50_ms"] = round(c["exec_true"]["p50"] * 1e3, 2)
        out["containerd_exec_cpu_ms"] = round(c["exec_true"]["cpu_per_exec_s"] * 1e3, 2)
    return out


def _fanout_summary(doc: dict[str, Any]) -> dict[str, Any]:
    """fanout_{warm,cold}_*: the run's own mode and the other node's (rollstack_bench.node_fanout)."""
    from rollstack_bench.node_fanout import mode_summary

    return {k: v for f in (doc["agent"]["fanout"], doc.get("fanout_other"))
            if f and "create_ratio" in f for k, v in mode_summary(f).items()}


def _human(doc: dict[str, Any]) -> None:
    m, s = doc["machine"], doc["summary"]
    print(f"machine: {m.get('cpu')}, {m.get('cores')} cores, kernel {m.get('kernel')}, cgroup "
          f"{m.get('cgroup')}; command: {doc['command']}")
    print(f"exec true over HTTP: agent p50 {s['exec_p50_ms']} ms, node CPU {s['exec_node_cpu_ms']} ms"
          f" | runc exec p50 {s['runc_exec_p50_ms']} ms, node CPU {s['runc_exec_node_cpu_ms']} ms"
          + (f" | ctr task exec p50 {s['containerd_exec_p50_ms']} ms, CPU {s['containerd_exec_cpu_ms']} ms"
             if "containerd_exec_p50_ms" in s else ""))
    print(f"throughput: {s['execs_per_s']} execs/s (SDK threads)"
          + (f", {s['execs_per_s_wrk']} execs/s (wrk; node CPU {s['exec_node_cpu_ms_wrk']} ms/exec, "
             f"failures {s['exec_failures_wrk']})" if "execs_per_s_wrk" in s else "")
          + f"; fan-out of {doc['agent']['fanout']['count']}: "
          f"{s['fanout_ratio']}x one")
    print("fan-out: " + ", ".join(f"{k.removeprefix('fanout_')} {v}" for k, v in s.items()
                                   if k.startswith(("fanout_warm", "fanout_cold"))))
    print(f"bursts: {s['burst_envs_per_s_p50']} envs/s (p50 of bursts; "
          f"{s['burst_drained_envs_per_s_p50']} counting the background destroys), p99/p50 <= "
          f"{s['burst_p99_over_p50']}, failures {s['burst_failures']}"
          + (f"; containerd {s['containerd_burst_envs_per_s_p50']} envs/s -> "
             f"{s['burst_vs_containerd']}x" if "burst_vs_containerd" in s else ""))
    print(f"admitted small environments (0.1 core, 64 MiB): {s['admitted_small_envs']}; warm pool "
          f"{s['warm_pool'] or 'off'}")
    if "image_burst_envs_per_s_p50" in s:
        print(f"image {doc['image']['ref']}: fan-out {s['image_fanout_ratio']}x one; bursts "
              f"{s['image_burst_envs_per_s_p50']} envs/s, failures {s['image_burst_failures']}"
              + (f"; containerd {s['containerd_image_burst_envs_per_s_p50']} envs/s -> "
                 f"{s['image_burst_vs_containerd']}x" if "image_burst_vs_containerd" in s else ""))


def register(app: typer.Typer) -> None:
    @app.command("node")
    def bench_node(
        as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
        execs: Annotated[int, typer.Option("--execs", help="`exec true` samples per path")] = 300,
        callers: Annotated[int, typer.Option("--callers", help="concurrent exec callers")] = 16,
        seconds: Annotated[float, typer.Option("--seconds", help="throughput run length")] = 5.0,
        fanout: Annotated[int, typer.Option("--fanout", help="GRPO group size")] = 8,
        fanout_rounds: Annotated[int, typer.Option("--fanout-rounds", help="fan-out rounds per mode")] = 5,
        only_fanout: Annotated[bool, typer.Option("--only-fanout", help="only the fan-out, warm pool "
                                                  "on and off (the other options but --fanout* ignored)")] = False,
        burst: Annotated[int, typer.Option("--burst", help="concurrent create->exec->destroy")] = 128,
        bursts: Annotated[int, typer.Option("--bursts", help="bursts per system")] = 3,
        containerd: Annotated[bool, typer.Option("--containerd/--no-containerd",
                                                 help="measure containerd (ctr) too")] = True,
        warm: Annotated[int, typer.Option("--warm", help="the node's warm pool per stack "
                                          "(NodeConfig.warm_pool; 0: off), refilled between bursts")] = 0,
        image: Annotated[str | None, typer.Option("--image", help="also fan-out and bursts on this "
                                                  "image (oci:DIR[:TAG] or a registry ref), imported as a group")] = None,
    ) -> None:
        """Node throughput: exec latency/CPU, execs/s, fan-out, bursts, admission; vs containerd."""
        from rollstack.cli.output import emit

        if only_fanout:
            from rollstack_bench.node_fanout import run_fanout_only

            emit(run_fanout_only(fanout, fanout_rounds, warm), as_json, lambda d: print(d["summary"]))
            return
        emit(run_bench(execs, callers, seconds, fanout, burst, bursts, containerd, warm, image,
                       fanout_rounds), as_json, _human)
