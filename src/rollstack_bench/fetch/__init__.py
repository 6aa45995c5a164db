"""`rollstack bench fetch`: the lazy layer store on a realistic stack, measured side by side.

Stack: the benchmark corpus (`rollstack bench corpus build`): Debian bookworm + python3, a real
PyPI project with its test dependencies (more-itertools + pytest), and the mini-swe-agent
harness (~1 GB, ~40k files), converted to rollstack layers and published to a docker-registry
in its own network namespace behind a shaped link (`bench.link.netem`, profile `dc` = 1 Gbit/s,
2 ms RTT). Without root/netns support it falls back to a loopback registry and says so.

Measured (each against the same registry, in one run):
- cold: fresh daemon state, page cache dropped: add the stack's layers (TOCs), mount an overlay,
  chroot + `python3 -c "import more_itertools, pytest"`; bytes fetched vs stack size
- warm (node cache, page cache dropped) and warm (page cache): the same command
- FUSE overhead: warm command through the lazy store vs an overlay of the unpacked directories
- sequential read of a 1 GiB file: uncached (from the registry), from the node disk cache, from
  the page cache
- GRPO group of 8 with access traces: critical-path bytes of rollouts 2-8 vs rollout 1 (node
  caches dropped between rollouts, as if each landed on another node; the trace store is kept)
- handover: the daemon is SIGKILLed under a running environment and restarted; the environment's
  command (page cache dropped) runs meanwhile, with the fd-holder and without

Code: `rig` (blobs, registry, overlay, chroot, `StackRig`), `readpath` and `traces` (the
sections, methods of `Bench`), this module (the command).
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import typer

from rollstack_bench import report
from rollstack_bench.fetch.readpath import BG_MODES, ReadPathSections
from rollstack_bench.fetch.rig import COMMAND, STACK, WORKDIR, big_file_layer, ensure_blob, log, registry
from rollstack_bench.fetch.traces import TraceSections

DEFAULT_CORPUS = Path(os.environ.get("ROLLSTACK_CORPUS_CACHE", "/var/cache/rollstack/corpus")) / "small"
DEFAULT_WORK = Path("/var/cache/rollstack/bench-fetch")


class Bench(ReadPathSections, TraceSections):
    """Every section of `bench fetch` over one published stack."""


SECTIONS = ("cold", "ablation", "overhead", "background", "overlay-options", "throughput", "grpo", "sharedtrace",
            "handover")
ABLATION = {"default": {}, "dir-prefetch-2m": {"dir_prefetch_bytes": 2 << 20},
            "neighbours-512k": {"neighbor_bytes": 512 << 10}, "writeback-now": {"writeback_quiet": 0.0},
            "kernel-open": {"no_open": False}}
OVERLAY_OPTIONS = ["", "metacopy=off", "redirect_dir=off,metacopy=off,index=off,xino=off"]


def run_bench(corpus: Path, work: Path, profile: str, runs: int, rollouts: int, big_mib: int,
              only: tuple[str, ...] = SECTIONS, bg_modes: tuple[str, ...] = BG_MODES) -> dict[str, Any]:
    from rollstack.store import open_store

    for name in STACK:
        if not (corpus / name).is_dir():
            raise typer.BadParameter(f"{corpus / name} missing: run `rollstack bench corpus build` first")
    work.mkdir(parents=True, exist_ok=True)
    blobs = [(name, *ensure_blob(corpus / name, work / "blobs", name)) for name in STACK]
    big = big_file_layer(work / "blobs", big_mib) if big_mib else None
    doc: dict[str, Any] = {"machine": report.machine_facts(), "command": " ".join(["rollstack", "bench", "fetch", *sys.argv[3:]]),
                           "stack": [{"name": n, "digest": d, "bytes": p.stat().st_size} for n, d, p in blobs],
                           "workload": f"chroot + cd {WORKDIR} && {COMMAND}"}
    with ExitStack() as stack:
        url, link = stack.enter_context(registry(work, profile))
        doc["link"] = link
        store = open_store(url)
        t0 = time.perf_counter()
        for name, digest, path in blobs + ([("big", *big)] if big else []):
            store.put_blob(f"bench/{name}", digest, path)
        log(f"published in {time.perf_counter() - t0:.1f}s to {url}")
        refs = [{"repo": f"bench/{n}", "digest": d} for n, d, _ in blobs]
        sizes = {d: p.stat().st_size for _, d, p in blobs}
        data = work / "registry" / "data" if link.get("shaped") else work / "registry-loopback" / "data"
        bench = Bench(work, url, refs, sizes, data)
        try:
            manifest = json.loads((corpus / "manifest.json").read_text())
            bench.unpacked_bytes = sum(c["bytes"] for c in manifest["components"] if c["name"] in STACK)
        except (OSError, ValueError, KeyError):
            pass
        if "cold" in only:
            log("cold/warm")
            doc["init"] = bench.cold_and_warm(runs)
        if "ablation" in only:
            log("cold ablation")
            doc["cold_ablation"] = bench.cold_ablation(runs, ABLATION)
        if "overhead" in only:
            log("fuse overhead")
            doc["fuse_overhead"] = bench.fuse_overhead(corpus)
        if "background" in only:
            log("background fill vs foreground latency")
            doc["background_fill"] = bench.background_interference(max(1, min(runs, 3)), bg_modes)
        if "overlay-options" in only:
            log("overlay options")
            doc["overlay_options"] = bench.overlay_options(corpus, OVERLAY_OPTIONS)
        if big and "throughput" in only:
            log("throughput")
            rate = link.get("rate_bit")
            doc["throughput_1GiB"] = bench.throughput({"repo": "bench/big", "digest": big[0]},
                                                      rate / 8 if rate else None)
        if "grpo" in only:
            log("grpo group")
            doc["grpo"] = bench.grpo_group(rollouts)
        if "sharedtrace" in only:
            log("cold node with vs without a shared trace")
            doc["shared_trace"] = bench.shared_trace(runs)
        if "handover" in only:
            log("daemon restart under a running environment, with and without the fd-holder")
            doc["handover"] = bench.handover(max(1, min(runs, 3)))
    doc["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return doc


def _human(doc: dict[str, Any]) -> None:
    print(json.dumps(doc, indent=2))


def register(app: typer.Typer) -> None:
    @app.command("fetch")
    def fetch_cmd(
        as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
        corpus: Path = typer.Option(DEFAULT_CORPUS, help="built corpus flavor directory"),
        work: Path = typer.Option(DEFAULT_WORK, help="blobs, registry data and scratch"),
        profile: str = typer.Option("dc", help="link profile (dc, lan, wan) or 'none' for loopback"),
        runs: int = typer.Option(3, help="cold starts to measure"),
        rollouts: int = typer.Option(8, help="rollouts in the GRPO group"),
        big_mib: int = typer.Option(1024, help="size of the throughput file (0: skip)"),
        only: str = typer.Option(",".join(SECTIONS), help="comma-separated sections to run: " + ", ".join(SECTIONS)),
        bg_modes: str = typer.Option(",".join(BG_MODES), help="background section: fill off / gated (default "
                                     "config) / ungated (no grace, no quiet period, no rate limit)"),
    ) -> None:
        """Cold/warm start, FUSE overhead, throughput and trace prefetch of the lazy store."""
        from rollstack.cli.output import emit

        if os.geteuid() != 0:
            raise typer.BadParameter("needs root (FUSE, overlayfs, chroot, drop_caches)")
        chosen = tuple(x.strip() for x in only.split(",") if x.strip())
        unknown = set(chosen) - set(SECTIONS)
        if unknown:
            raise typer.BadParameter(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
        doc = run_bench(corpus, work, profile, runs, rollouts, big_mib if "throughput" in chosen else 0, chosen,
                        tuple(x.strip() for x in bg_modes.split(",") if x.strip()))
        emit(doc, as_json, _human)


__all__ = ["register", "run_bench"]
