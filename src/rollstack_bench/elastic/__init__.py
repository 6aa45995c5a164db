"""`rollstack bench elastic`: fixed quotas (median-sized, tail-sized) vs elastic, on real cgroups.

A mix of bursty tasks drawn from the paper's distributions (peak CPU median 1 core / p99 68 cores,
peak memory median 0.15 GiB / p99 7 GiB), scaled to this machine (CPU x1/4, memory x1/2, clamped
to a bench node of 2 cores / 4 GiB and a per-environment cap of 2 cores / 1 GiB), runs as real
processes in real cgroups (`rollstack_bench.workload`) under:

  (a) a fixed quota sized for the median (v1 OOM killer on: tail tasks get killed, counted),
  (b) a fixed quota sized for the tail (every task fits; the node admits few at once),
  (c) elastic: start small, the `Provisioner` grows/shrinks quotas every 200 ms.

The same `--concurrency` tasks are in flight in every scenario. Reported: per-task and total
completion time, OOM kills, environments admitted at once for the node (admission rule of
`rollstack.provision.policy`), memory reserved over time (PNG), the 256-cgroup sampling cost.

Code: `mix` (the task mix and each scenario's quotas: pure), this module (running a scenario on
real cgroups, the sampling cost, the plot, summary and command).
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import typer

from rollstack_bench import report
from rollstack_bench.elastic.mix import CAP_CPU, CAP_MEMORY, NODE, admitted_at_once, draw_tasks, scenarios
from rollstack.provision.config import GiB, MiB, NodeCapacity, PolicyConfig

BENCH_CPU_WEIGHT = 1600  # v2 units (default 100): 16x a default process on the shared host


# -- running a scenario (real cgroups) -------------------------------------------------------------
def run_scenario(name: str, quota: dict[str, Any], tasks: list[dict[str, Any]], backend: Any, parent: str,
                 concurrency: int, config: PolicyConfig, timeout: float) -> dict[str, Any]:
    from rollstack.provision.controller import Provisioner
    from rollstack_bench.workload import WorkloadProcess

    elastic = name == "elastic"
    terminated: dict[str, dict[str, Any]] = {}
    prov = None
    if elastic:
        def on_terminate(env_id: str, reason: dict[str, Any]) -> None:
            terminated[env_id] = reason
            backend.kill(f"{parent}/{name}-{env_id}")

        prov = Provisioner(backend, config, NODE, on_terminate=on_terminate).start()
    pending = list(tasks)
    running: dict[str, tuple[dict[str, Any], str, Any]] = {}
    results: dict[str, dict[str, Any]] = {}
    timeline: list[tuple[float, int, int, float]] = []
    t0 = time.monotonic()
    try:
        while pending or running:
            while pending and len(running) < concurrency:
                task = pending.pop(0)
                path = f"{parent}/{name}-{task['id']}"
                backend.create(path)
                if elastic:
                    prov.register(task["id"], path, quota["cpu"], quota["memory"], quota["max_cpu"], quota["max_memory"])
                else:
                    backend.set_cpu(path, quota["cpu"])
                    backend.set_memory(path, quota["memory"])
                    if hasattr(backend, "set_oom_kill"):
                        backend.set_oom_kill(path, True)  # a fixed quota has nothing to wait for
                running[task["id"]] = (task, path, WorkloadProcess(backend, path, task["steps"]))
            time.sleep(0.2)
            reserved, used = 0, 0
            for tid, (task, path, w) in list(running.items()):
                try:
                    s = backend.sample(path)
                    used += s.memory_usage
                    reserved += s.memory_limit
                except OSError:
                    pass
                if w.poll() is None and time.monotonic() - t0 < timeout:
                    continue
                oom_kills = backend.oom_kills(path)
                if w.poll() is None:
                    w.kill()
                rc = w.wait(5)
                status = "ok" if rc == 0 else ("oom_terminated" if tid in terminated else
                                               "oom_killed" if oom_kills or rc == -9 else f"exit {rc}")
                if time.monotonic() - t0 >= timeout and rc != 0 and tid not in terminated:
                    status = "timeout"
                results[tid] = {"time": round(w.elapsed, 3), "status": status}
                if prov is not None:
                    q = prov.quotas(tid)
                    results[tid].update(final_cpu=q["cpu"], final_memory=q["memory"],
                                        peak_cpu_used=round(q["peak_cpu"], 3), peak_memory_used=q["peak_memory"])
                    prov.unregister(tid)
                backend.remove(path)
                del running[tid]
            cpu_reserved = prov.committed()["cpu"] if prov else quota["cpu"] * len(running)
            timeline.append((round(time.monotonic() - t0, 2), reserved, used, cpu_reserved))
    finally:
        for tid, (task, path, w) in running.items():
            w.kill()
            backend.remove(path)
        if prov is not None:
            prov.stop()
    makespan = time.monotonic() - t0
    doc = {
        "quota": quota,
        "tasks": results,
        "total_time": round(sum(r["time"] for r in results.values()), 2),
        "makespan": round(makespan, 2),
        "oom_kills": sum(r["status"] in ("oom_killed", "oom_terminated") for r in results.values()),
        "completed": sum(r["status"] == "ok" for r in results.values()),
        "memory_reserved_mean": int(sum(r for _, r, _, _ in timeline) / max(1, len(timeline))),
        "memory_reserved_peak": max((r for _, r, _, _ in timeline), default=0),
        "timeline": timeline,
    }
    if prov is not None:
        doc["write_latency_us"] = prov.write_latency()
        doc["events"] = len(prov.events())
        doc["loop_cost"] = {k: round(v, 4) for k, v in prov.loop_cost().items()}
    return doc


# -- sampling cost ---------------------------------------------------------------------------------
def sampling_cost(backend: Any, parent: str, n: int, seconds: float, config: PolicyConfig) -> dict[str, Any]:
    """Sample n real (empty) cgroups every 200 ms: raw backend reads, then the full Provisioner loop."""
    from rollstack.provision.controller import Provisioner

    paths = [f"{parent}/s{i:03d}" for i in range(n)]
    t_create = time.perf_counter()
    for p in paths:
        backend.create(p)
    create_s = time.perf_counter() - t_create
    try:
        raw = _sample_loop(backend, paths, seconds, config.sample_period_s)
        if getattr(backend, "lazy", False):  # worst case: every file read on every sample
            eager = type(backend)(backend.root, lazy=False)
            raw["eager_all_files"] = _sample_loop(eager, paths, seconds / 2, config.sample_period_s)
            for p in paths:
                eager.forget(p)
        prov = Provisioner(backend, config, NodeCapacity(cpu=NODE.cpu, memory=NODE.memory))
        for i, p in enumerate(paths):
            prov.register(f"s{i:03d}", p, 0.1, 16 * MiB, check_admission=False)
        prov.start()
        time.sleep(seconds)
        prov.stop()
        lc = prov.loop_cost()
        loop = {"percent_of_core": round(lc["percent_of_core"], 3), "us_per_env_tick": round(lc["us_per_sample"], 2),
                "ticks": lc["ticks"]}
        lat = prov.write_latency()
        for p in paths:
            prov.unregister(p.rsplit("/", 1)[1])
    finally:
        for p in paths:
            backend.remove(p)
    return {"environments": n, "period_s": config.sample_period_s, "seconds": seconds,
            "create_ms_per_cgroup": round(create_s / n * 1e3, 3), "backend_sample": raw,
            "provisioner_loop": loop, "register_write_latency_us": lat}


def _sample_loop(backend: Any, paths: list[str], seconds: float, period: float) -> dict[str, Any]:
    for p in paths:  # warm-up: the first sample opens and caches each cgroup's descriptors
        backend.sample(p)
    cpu, ticks = 0.0, 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        c0 = time.thread_time()
        for p in paths:
            backend.sample(p)
        cpu += time.thread_time() - c0
        ticks += 1
        time.sleep(max(0.0, start + ticks * period - time.monotonic()))
    wall = time.monotonic() - start
    return {"percent_of_core": round(100 * cpu / wall, 3), "us_per_sample": round(cpu / (ticks * len(paths)) * 1e6, 2),
            "ticks": ticks}


# -- plot and report -------------------------------------------------------------------------------
def plot(doc: dict[str, Any], out: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    colours = {"fixed_median": "tab:orange", "fixed_tail": "tab:red", "elastic": "tab:blue"}
    for name, sc in doc["scenarios"].items():
        tl = sc["timeline"]
        xs = [t for t, *_ in tl]
        ax.plot(xs, [r / MiB for _, r, _, _ in tl], color=colours[name], label=f"{name}: reserved")
        ax.plot(xs, [u / MiB for _, _, u, _ in tl], color=colours[name], linestyle=":", label=f"{name}: used")
    ax.set_xlabel("seconds since scenario start")
    ax.set_ylabel("memory (MiB), sum over running environments")
    ax.set_title(f"bench elastic: {len(doc['tasks'])} tasks, {doc['concurrency']} in flight")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "elastic-memory.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def run(quick: bool, n_tasks: int | None, seed: int, concurrency: int, out: Path, command: str) -> dict[str, Any]:
    from rollstack.provision.detect import detect_backend

    if os.geteuid() != 0:
        from rollstack.errors import InvalidRequest

        raise InvalidRequest("bench elastic creates cgroups: run it as root")
    backend = detect_backend()
    config = PolicyConfig()
    n = n_tasks or (6 if quick else 12)
    tasks = draw_tasks(n, seed, quick)
    quotas = scenarios(tasks)
    parent = f"rollstack-bench-{uuid.uuid4().hex[:8]}"
    machine = report.machine_facts()
    backend.create(parent)
    # This machine is shared: weight the bench's parent cgroup 16x so the scenarios see something
    # closer to a dedicated node and background load skews them less (documented in the report).
    backend.set_cpu_weight(parent, BENCH_CPU_WEIGHT)
    doc: dict[str, Any] = {"command": command, "machine": machine, "cgroup_version": backend.version,
                           "bench_cpu_weight": BENCH_CPU_WEIGHT,
                           "node": {"cpu": NODE.cpu, "memory": NODE.memory, "cap_cpu": CAP_CPU, "cap_memory": CAP_MEMORY},
                           "policy": config.model_dump(), "concurrency": concurrency, "seed": seed,
                           "tasks": [{k: t[k] for k in ("id", "peak_cpu", "peak_memory")} for t in tasks],
                           "scenarios": {}}
    try:
        for name, q in quotas.items():
            _log(f"scenario {name}: quota {q}")
            sc = run_scenario(name, q, tasks, backend, parent, concurrency, config, timeout=60 if quick else 150)
            sc["admitted_at_once"] = admitted_at_once(q["cpu"], q["memory"], config)
            doc["scenarios"][name] = sc
            _log(f"  total {sc['total_time']} s, makespan {sc['makespan']} s, oom kills {sc['oom_kills']}")
        _log("sampling cost: 256 cgroups at 200 ms")
        doc["sampling"] = sampling_cost(backend, parent, 256, 2.0 if quick else 10.0, config)
    finally:
        backend.remove(parent)
    doc["summary"] = summarize(doc)
    out.mkdir(parents=True, exist_ok=True)
    doc["plot"] = plot(doc, out)
    import json

    (out / "elastic.json").write_text(json.dumps(doc, indent=1, default=str))
    return doc


def summarize(doc: dict[str, Any]) -> dict[str, Any]:
    a, b, c = (doc["scenarios"][k] for k in ("fixed_median", "fixed_tail", "elastic"))
    both = [t for t, r in a["tasks"].items() if r["status"] == "ok" and c["tasks"][t]["status"] == "ok"]
    a_common = sum(a["tasks"][t]["time"] for t in both)
    c_common = sum(c["tasks"][t]["time"] for t in both)
    under_cap = {t["id"] for t in doc["tasks"] if t["peak_memory"] < CAP_MEMORY}
    elastic_kills_under_cap = sum(c["tasks"][t]["status"] != "ok" for t in under_cap)
    # The RL framework resamples an OOM-killed task; charge (a) a rerun under the tail-sized quota.
    a_retry = sum(r["time"] + (b["tasks"][t]["time"] if r["status"] != "ok" else 0) for t, r in a["tasks"].items())
    s = {
        "speedup_vs_fixed_median_common_tasks": round(a_common / c_common, 2) if c_common else None,
        "speedup_vs_fixed_median_with_rerun_of_killed": round(a_retry / c["total_time"], 2),
        "common_tasks": len(both),
        "speedup_vs_fixed_median_total": round(a["total_time"] / c["total_time"], 2),
        "speedup_vs_fixed_tail_total": round(b["total_time"] / c["total_time"], 2),
        "oom_kills": {k: v["oom_kills"] for k, v in doc["scenarios"].items()},
        "elastic_failures_under_cap": elastic_kills_under_cap,
        "admitted_at_once": {k: v["admitted_at_once"] for k, v in doc["scenarios"].items()},
        "admission_ratio_elastic_vs_tail": round(c["admitted_at_once"] / max(1, b["admitted_at_once"]), 2),
        "memory_reserved_mean_mib": {k: round(v["memory_reserved_mean"] / MiB, 1) for k, v in doc["scenarios"].items()},
        "sampling_256_percent_of_core": doc["sampling"]["backend_sample"]["percent_of_core"],
        "provisioner_loop_256_percent_of_core": doc["sampling"]["provisioner_loop"]["percent_of_core"],
    }
    s["targets"] = {
        "elastic_ge_1_5x_faster_than_fixed_median": (s["speedup_vs_fixed_median_common_tasks"] or 0) >= 1.5,
        "elastic_zero_oom_kills_under_cap": elastic_kills_under_cap == 0,
        "elastic_admits_ge_2x_fixed_tail": s["admission_ratio_elastic_vs_tail"] >= 2,
        "sampling_256_le_2pct_core": s["sampling_256_percent_of_core"] <= 2.0,
    }
    return s


def _log(msg: str) -> None:
    print(f"[bench elastic] {msg}", file=sys.stderr, flush=True)


def _human(doc: dict[str, Any]) -> None:
    m = doc["machine"]
    print(f"machine: {m['cpu']} ({m['cores']} cores, {m['memory_bytes'] / GiB:.1f} GiB, load {m['loadavg']:.2f}), "
          f"kernel {m['kernel']}, cgroup v{doc['cgroup_version']}")
    print(f"command: {doc['command']}")
    n = doc["node"]
    print(f"bench node: {n['cpu']:g} cores / {n['memory'] / GiB:g} GiB; per-env cap {n['cap_cpu']:g} cores / "
          f"{n['cap_memory'] / GiB:g} GiB; {len(doc['tasks'])} tasks, {doc['concurrency']} in flight")
    names = list(doc["scenarios"])
    print(f"{'task':5} {'peak cpu':>8} {'peak MiB':>8}  " + "  ".join(f"{k:>20}" for k in names))
    for t in doc["tasks"]:
        cells = []
        for k in names:
            r = doc["scenarios"][k]["tasks"][t["id"]]
            cells.append(f"{r['time']:>8.2f}s {r['status']:>11}")
        print(f"{t['id']:5} {t['peak_cpu']:>8.2f} {t['peak_memory'] / MiB:>8.0f}  " + "  ".join(cells))
    for k, sc in doc["scenarios"].items():
        q = sc["quota"]
        print(f"{k:13} quota {q['cpu']:g} cores / {q['memory'] / MiB:.0f} MiB: total {sc['total_time']:.1f} s, "
              f"makespan {sc['makespan']:.1f} s, OOM kills {sc['oom_kills']}, admitted at once {sc['admitted_at_once']}, "
              f"memory reserved mean {sc['memory_reserved_mean'] / MiB:.0f} MiB")
    sp = doc["sampling"]
    eager = sp["backend_sample"].get("eager_all_files")
    print(f"sampling {sp['environments']} cgroups every {sp['period_s']} s: backend {sp['backend_sample']['percent_of_core']}% "
          f"of a core ({sp['backend_sample']['us_per_sample']} us/sample)"
          + (f", reading every file {eager['percent_of_core']}% ({eager['us_per_sample']} us)" if eager else "")
          + "; full provisioner loop "
          f"{sp['provisioner_loop']['percent_of_core']}% ({sp['provisioner_loop']['us_per_env_tick']} us/env/tick)")
    if "write_latency_us" in doc["scenarios"]["elastic"]:
        w = doc["scenarios"]["elastic"]["write_latency_us"]
        kinds = ", ".join(f"{k} p50 {v['p50_us']:.0f}/p99 {v['p99_us']:.0f} us ({v['count']})"
                          for k, v in w.get("by_kind", {}).items())
        print(f"quota write latency: p50 {w.get('p50_us', 0):.0f} us, p99 {w.get('p99_us', 0):.0f} us "
              f"({w['count']} writes; {kinds})")
    s = doc["summary"]
    print(f"elastic vs fixed-median: {s['speedup_vs_fixed_median_common_tasks']}x on the {s['common_tasks']} tasks both "
          f"completed ({s['speedup_vs_fixed_median_total']}x on all task times, "
          f"{s['speedup_vs_fixed_median_with_rerun_of_killed']}x if killed tasks are rerun tail-sized); admits "
          f"{s['admission_ratio_elastic_vs_tail']}x the fixed-tail count")
    print(f"plot: {doc['plot']}")
    print("targets: " + ", ".join(f"{k}={'PASS' if v else 'MISS'}" for k, v in s["targets"].items()))


def register(app: typer.Typer) -> None:
    @app.command("elastic")
    def elastic_bench(
        as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
        out: Path = typer.Option(Path("results/elastic"), "--out", help="where the PNG and JSON go"),
        quick: bool = typer.Option(False, "--quick", help="fewer, shorter tasks (< 1 minute)"),
        tasks: Optional[int] = typer.Option(None, "--tasks", help="number of tasks (default 12, quick 6)"),
        seed: int = typer.Option(7, "--seed"),
        concurrency: int = typer.Option(2, "--concurrency", help="tasks in flight in every scenario"),
    ) -> None:
        """Fixed median / fixed tail / elastic quotas on real bursty workloads in real cgroups."""
        from rollstack.cli.output import emit

        command = "rollstack bench elastic" + (" --quick" if quick else "") + (f" --tasks {tasks}" if tasks else "") + \
            (f" --seed {seed}" if seed != 7 else "") + (f" --concurrency {concurrency}" if concurrency != 2 else "")
        doc = run(quick, tasks, seed, concurrency, out, command)
        if as_json:
            doc = {**doc, "scenarios": {k: {kk: vv for kk, vv in v.items() if kk != "timeline"}
                                        for k, v in doc["scenarios"].items()}}
        emit(doc, as_json, _human)
