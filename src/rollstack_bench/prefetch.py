"""`rollstack bench prefetch --image REF --command CMD`: the trace prefetch path alone, by plan.

A cold start with a trace waits for one thing above all: the trace's chunks coming over the
link. This benchmark imports the image as a layer group (`plan.imports.import_image`, cached),
records the command's trace once with `import --probe` (`node.probe`), then fetches that trace
with a bare `ChunkFetcher` (memory cache only, no FUSE, no command competing) over the bench's
shaped link, once per plan and round, the plans alternated so load hits them alike:

- `fixed-512k`: fixed 512 KiB waves, 6 parallel requests, 128 KiB gaps bridged (the plan before
  this pass);
- `growing`: waves from 512 KiB doubling to 4 MiB (`fetch.waves`), 8 requests, 256 KiB gaps;
- `multi-range` (the default now): growing waves, several ranges per GET (`store.byteranges`),
  16 KiB gaps.

Reported per plan: seconds until the whole trace is local (p50/min/max), range GETs and bytes
over the link.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import typer

from rollstack.errors import InvalidRequest

if TYPE_CHECKING:
    from rollstack.fetch.traces import Trace

PLANS: dict[str, dict[str, Any]] = {
    "fixed-512k": {"first": 512 << 10, "cap": 512 << 10, "prefetch_requests": 6, "prefetch_gap": 128 << 10,
                   "multi": False},
    "growing": {"first": 512 << 10, "cap": 4 << 20, "prefetch_requests": 8, "prefetch_gap": 256 << 10, "multi": False},
    "multi-range": {"first": 512 << 10, "cap": 4 << 20, "prefetch_requests": 8, "prefetch_gap": 256 << 10,
                    "multi": True},
}


def fetch_trace(store: Any, repo: str, trace: "Trace", plan: dict[str, Any]) -> dict[str, Any]:
    """Fetch every chunk of the trace as the lazy store's trace prefetch does, with `plan`."""
    import trio

    from rollstack.fetch.config import FetchConfig
    from rollstack.fetch.fetcher import ChunkFetcher
    from rollstack.fetch.layer import RemoteLayer
    from rollstack.fetch.memory import MemoryChunkCache
    from rollstack.fetch.waves import prefetch_trace
    from rollstack.store import byteranges

    cfg = FetchConfig(prefetch_requests=plan["prefetch_requests"], prefetch_gap=plan["prefetch_gap"])
    layers = {d: RemoteLayer(repo, d, lambda off, n, d=d: store.read_blob(repo, d, off, n),
                             read_ranges=lambda spans, d=d: byteranges.read_ranges(store, repo, d, spans),
                             multi_range=lambda: bool(plan["multi"]))
              for d in {t.layer for t in trace}}

    async def main() -> tuple[float, int, dict[str, Any]]:
        fetcher = ChunkFetcher(cfg, MemoryChunkCache(4 << 30))
        async with fetcher.running():
            t = time.perf_counter()
            waves = await prefetch_trace(fetcher, [(layers[c.layer], c.chunk) for c in trace],
                                         first=plan["first"], cap=plan["cap"])
            return time.perf_counter() - t, waves, fetcher.metrics.snapshot()

    seconds, waves, snap = trio.run(main)
    return {"seconds": seconds, "requests": int(snap["requests"].get("registry", 0)),
            "link_bytes": int(snap["transferred_bytes"].get("registry", 0)), "waves": waves}


def run(image: str, command: str, *, rounds: int, work: Path, plans: list[str],
        log: Callable[[str], None]) -> dict[str, Any]:
    from rollstack_bench.init_image import image_name
    from rollstack_bench.systems.rig import BenchRig
    from rollstack_bench.systems.rollstack import forget_shared_traces, work_lock
    from rollstack.fetch import shared_traces
    from rollstack.node.probe import probe_group
    from rollstack.plan.imports import import_image
    from rollstack.store import open_store

    bad = [p for p in plans if p not in PLANS]
    if bad or not plans:
        raise InvalidRequest(f"--plans: choose from {', '.join(PLANS)}")
    repo = image_name(image).replace("bench-image/", "bench-group/", 1)
    with work_lock(work), BenchRig(work, "dc") as rig:
        store = open_store(rig.registry.url)
        res = import_image(image, f"{repo}:latest", store, cache_dir=work / "import-cache", work_dir=work)
        forget_shared_traces(rig.registry.root / "data")  # the probe's trace is then the only one
        probe = probe_group(rig.registry.url, [f"{repo}:latest"], command, work=None)
        if probe.get("exit_code") != 0:
            raise InvalidRequest(f"--command failed in the image (exit {probe.get('exit_code')}): {probe.get('output', '')}")
        key = probe.get("trace_key")
        sizes = {la["digest"]: store.blob_size(repo, la["digest"]) for la in res.layers}
        trace = shared_traces.lookup(store, key, sizes) if key else None
        if not trace:
            raise InvalidRequest(f"the probe published no trace for {key!r}")
        stored = sum(c.chunk.blob_size for c in trace)
        log(f"trace of {key}: {len(trace)} chunks, {stored / 1e6:.1f} MB stored")
        samples: dict[str, list[dict[str, Any]]] = {p: [] for p in plans}
        for rnd in range(rounds):
            for p in plans:
                got = fetch_trace(store, repo, trace, PLANS[p])
                got["load"] = os.getloadavg()[0]
                samples[p].append(got)
                log(f"round {rnd} {p}: {got['seconds']:.3f}s, {got['requests']} GETs, {got['link_bytes'] / 1e6:.1f} MB "
                    f"(load {got['load']:.1f})")
        link = rig.link_facts()
    summary = {p: {"p50_s": statistics.median(s["seconds"] for s in v), "min_s": min(s["seconds"] for s in v),
                   "max_s": max(s["seconds"] for s in v), "requests": v[0]["requests"],
                   "link_mb": v[0]["link_bytes"] / 1e6} for p, v in samples.items()}
    return {"image": image, "command": command, "layers": len(res.layers), "trace_chunks": len(trace),
            "trace_stored_mb": stored / 1e6, "plans": {p: PLANS[p] for p in plans},
            "summary": summary, "samples": samples, "link": link}


def _human(doc: dict[str, Any]) -> None:
    print(f"{doc['image']}: trace {doc['trace_chunks']} chunks, {doc['trace_stored_mb']:.1f} MB stored")
    print(f"{'plan':<12} {'p50 s':>7} {'min':>7} {'max':>7} {'GETs':>6} {'MB':>7}")
    for p, s in doc["summary"].items():
        print(f"{p:<12} {s['p50_s']:>7.3f} {s['min_s']:>7.3f} {s['max_s']:>7.3f} {s['requests']:>6} {s['link_mb']:>7.1f}")


def register(app: typer.Typer) -> None:
    @app.command("prefetch")
    def prefetch_bench(
        image: str = typer.Option(..., help="OCI image (oci:DIR[:TAG] or HOST/NAME:TAG)"),
        command: str = typer.Option(..., help="the command whose trace is prefetched (sh -c)"),
        rounds: int = typer.Option(3, min=1, help="rounds (every plan once per round)"),
        plans: str = typer.Option(",".join(PLANS), help="comma-separated: " + ", ".join(PLANS)),
        work: Path = typer.Option(Path("/var/cache/rollstack/bench-init-image"), help="registry/import state"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
    ) -> None:
        """Trace prefetch alone (no FUSE, no command): seconds, GETs and bytes per request plan."""
        import sys

        from rollstack.cli.output import emit

        doc = run(image, command, rounds=rounds, work=work, plans=[p for p in plans.split(",") if p],
                  log=lambda m: print(f"[bench prefetch] {m}", file=sys.stderr, flush=True))
        emit(doc, as_json, _human)
