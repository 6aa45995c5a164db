"""`rollstack bench materialize --image REF --command CMD`: what materialization costs the
environments running while it runs.

A hot layer is materialized (`lowers.materialize`, `lowers.extract`) while environments use it on
FUSE lowers. Issue 13's rule: the copy runs off the critical path with a bounded CPU share and
never makes foreground work more than 10% slower. This benchmark imports the image as a layer
group (cached), starts a node whose materializer never acts on its own, creates one environment
on the FUSE lowers and warms it with the command, then per round:

- `idle`: the command `--runs` times in that environment, nothing else running;
- `extracting`: the node's own extraction of every layer of the stack (`extract.spawn_args`:
  its own process, SCHED_IDLE, nice 19, idle I/O class, chunks of the node's disk cache reused,
  the rest fetched over the bench's shaped link) started, and the command run again while it
  is alive (runs that end after the extraction are dropped and counted).

`--source registry` (default) leaves the node's disk cache as the command left it, so the
extraction fetches most of the blob from the bench registry. That registry runs on the same two
cores (in a network namespace): its CPU and the loopback link's are part of what the command
competes with here, unlike on a node whose registry is elsewhere. `--source cache` first pulls
every chunk into the node's disk cache (what background fill does), so the extraction only
reads, verifies and writes locally.

`--cpu` and `--min-idle` set the node's `materialize_cpu` and `materialize_min_idle` (0 and 0:
the extraction as it was before either bound). Reported: the command's wall time p50 per phase and their ratio, the extraction's wall and CPU
seconds (its share of one core), per round and overall. The extracted trees are deleted after
each round (the node never sees them).
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import typer

from rollstack.errors import InvalidRequest

LIMIT_RATIO = 1.10
"""Issue 13: foreground work at most 10% slower while a layer is materialized."""


def summarize(idle: list[float], during: list[float], extract_wall: list[float],
              extract_cpu: list[float]) -> dict[str, Any]:
    """The phases' p50s and ratio, the extraction's CPU share (pure: unit-tested)."""
    if not idle or not during:
        raise InvalidRequest("no command overlapped an extraction: raise --runs or use a bigger image")
    i, d = statistics.median(idle), statistics.median(during)
    wall, cpu = sum(extract_wall), sum(extract_cpu)
    return {"idle_p50_s": i, "extracting_p50_s": d, "ratio": d / i if i else None,
            "within_limit": bool(i) and d / i <= LIMIT_RATIO, "limit": LIMIT_RATIO,
            "runs_idle": len(idle), "runs_extracting": len(during),
            "extract_wall_s": wall, "extract_cpu_s": cpu, "extract_core_share": cpu / wall if wall else None}


def _spawn_extractions(mat: Any, repo: str, digests: list[str], out: Path) -> subprocess.Popen[str]:
    """One shell running the node's own extraction of each layer in turn (as its materializer
    does: one layer at a time, in its background cgroup), so its end is one process's end."""
    import shlex

    steps = [shlex.join(mat.extract_argv(repo, d, out / d.partition(":")[2])) + " >/dev/null" for d in digests]
    return subprocess.Popen(["/bin/sh", "-c", " && ".join(steps)], text=True)


SOURCES = ("registry", "cache")


def _fill_disk_cache(lazy: Any, repo: str, digests: list[str], timeout: float = 900.0) -> None:
    """Every chunk of these layers fetched and written to the node's disk cache."""
    lazy.fetch_all([{"repo": repo, "digest": d} for d in digests])
    end = time.monotonic() + timeout
    while lazy.stats().get("disk_cache", {}).get("writeback_chunks", 0) and time.monotonic() < end:
        time.sleep(0.2)


def run(image: str, command: str, *, rounds: int, runs: int, work: Path, source: str = "registry",
        cpu: float = 1.0, min_idle: float = 0.5, log: Callable[[str], None]) -> dict[str, Any]:
    from rollstack_bench.init_image import image_name
    from rollstack_bench.systems.rig import BenchRig
    from rollstack_bench.systems.rollstack import RollstackSystem, work_lock
    from rollstack.plan.imports import import_image
    from rollstack.store import open_store

    if not command.strip():
        raise InvalidRequest("--command: give the command to run in the image")
    if source not in SOURCES:
        raise InvalidRequest(f"--source: {source!r} is not one of {', '.join(SOURCES)}")
    repo = image_name(image).replace("bench-image/", "bench-group/", 1)
    rows: list[dict[str, Any]] = []
    idle_all: list[float] = []
    during_all: list[float] = []
    walls: list[float] = []
    cpus: list[float] = []
    with work_lock(work), BenchRig(work, "dc") as rig:
        store = open_store(rig.registry.url)
        res = import_image(image, f"{repo}:latest", store, cache_dir=work / "import-cache", work_dir=work)
        system = RollstackSystem("rollstack", rig.registry.url, work / "node-materialize", rig.link,
                                 max_environments=4, lowers={"materialize_after": 1 << 30, "materialize_cpu": cpu,
                                                         "materialize_min_idle": min_idle})
        system.start()
        try:
            system.clear()  # fresh node: every layer on FUSE
            mat = system.node.service.stages.lowers.materializer
            plan = system.plan({"name": "bench-materialize", "groups": [f"{repo}:latest"], "workdir": "/",
                                "resources": {"cpu": 1.0, "memory": "1Gi", "max_cpu": 2.0, "max_memory": "4Gi"}})
            env = system.node.create(plan)
            try:
                def once() -> float:
                    t = time.perf_counter()
                    r = env.exec(["/bin/sh", "-c", command], timeout=600)
                    if r.exit_code != 0:
                        raise InvalidRequest(f"--command failed in the image (exit {r.exit_code}): "
                                             f"{(r.stdout + r.stderr)[-300:]}")
                    return time.perf_counter() - t

                once()  # the command's chunks local, page cache warm
                digests = [la["digest"] for la in res.layers]
                if source == "cache":
                    _fill_disk_cache(system.node.service.stages.lazy, repo, digests)
                for rnd in range(rounds):
                    idle = [once() for _ in range(runs)]
                    out = Path(tempfile.mkdtemp(prefix="rs-bench-mat-", dir=work))
                    try:
                        before = resource.getrusage(resource.RUSAGE_CHILDREN)
                        t0 = time.perf_counter()
                        proc = _spawn_extractions(mat, repo, digests, out)
                        during: list[float] = []
                        late = 0
                        while proc.poll() is None and len(during) < runs:
                            dt = once()
                            if proc.poll() is None:
                                during.append(dt)
                            else:
                                late += 1
                        code = proc.wait()
                        wall = time.perf_counter() - t0
                        after = resource.getrusage(resource.RUSAGE_CHILDREN)
                        if code != 0:
                            raise RuntimeError(f"extraction failed (exit {code})")
                        used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                    finally:
                        shutil.rmtree(out, ignore_errors=True)
                    idle_all += idle
                    during_all += during
                    walls.append(wall)
                    cpus.append(used)
                    row = {"round": rnd, "idle_s": idle, "extracting_s": during, "dropped_late": late,
                           "extract_wall_s": wall, "extract_cpu_s": used, "load": os.getloadavg()[0]}
                    rows.append(row)
                    log(f"round {rnd}: idle p50 {statistics.median(idle):.3f}s, extracting "
                        + (f"p50 {statistics.median(during):.3f}s ({len(during)} runs)" if during else "no run")
                        + f"; extraction {wall:.1f}s wall, {used:.1f} CPU-s (load {row['load']:.1f})")
            finally:
                env.destroy()
        finally:
            system.stop()
        link = rig.link_facts()
    return {"image": image, "command": command, "source": source, "layers": len(res.layers),
            "materialize_cpu": cpu, "materialize_min_idle": min_idle,
            "stored_bytes": sum(int(la.get("size", 0)) for la in res.layers), "summary": summarize(idle_all, during_all, walls, cpus),
            "rounds": rows, "link": link}


def _human(doc: dict[str, Any]) -> None:
    s = doc["summary"]
    print(f"{doc['image']}: {doc['stored_bytes'] / 1e6:.0f} MB stored in {doc['layers']} layer(s), "
          f"extraction from the {doc['source']}, capped at {doc['materialize_cpu']} cores, "
          f"waiting for {doc['materialize_min_idle']} idle cores")
    print(f"command p50: idle {s['idle_p50_s']:.3f}s ({s['runs_idle']} runs), while extracting "
          f"{s['extracting_p50_s']:.3f}s ({s['runs_extracting']} runs): {s['ratio']:.2f}x "
          f"(limit {s['limit']:.2f}x: {'met' if s['within_limit'] else 'MISSED'})")
    print(f"extraction: {s['extract_wall_s']:.1f}s wall, {s['extract_cpu_s']:.1f} CPU-s "
          f"({s['extract_core_share']:.2f} of one core)")


def register(app: typer.Typer) -> None:
    @app.command("materialize")
    def materialize_bench(
        image: str = typer.Option(..., help="OCI image (oci:DIR[:TAG] or HOST/NAME:TAG)"),
        command: str = typer.Option(..., help="the foreground command (sh -c), run in an environment on FUSE lowers"),
        rounds: int = typer.Option(3, min=1, help="extractions"),
        runs: int = typer.Option(5, min=1, help="command runs per phase and round"),
        source: str = typer.Option("registry", help="where the extraction reads chunks: registry | cache"),
        cpu: float = typer.Option(1.0, min=0, help="the node's materialize_cpu (cores; 0: uncapped)"),
        min_idle: float = typer.Option(0.5, min=0, help="the node's materialize_min_idle (cores; 0: do not wait)"),
        work: Path = typer.Option(Path("/var/cache/rollstack/bench-init-image"), help="registry/import/node state"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
    ) -> None:
        """Foreground command slowdown while the node materializes the stack's layers."""
        from rollstack_bench.report import current_command, machine_facts
        from rollstack.cli.output import emit

        doc = run(image, command, rounds=rounds, runs=runs, work=work, source=source, cpu=cpu, min_idle=min_idle,
                  log=lambda m: typer.echo(f"[bench materialize] {m}", err=True))
        doc["machine"], doc["command_line"] = machine_facts(), current_command()
        emit(doc, as_json, _human)
