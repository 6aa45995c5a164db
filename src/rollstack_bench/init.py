"""`rollstack bench init`: environment init of rollstack vs the containerd baselines, one run.

Same stack (os + repository + harness of the corpus), same registry (docker-registry in the
shaped link's namespace), same node, same first command, for every system:
`docker-equivalent` and `dynamic-assembly` (rollstack_bench.systems.baselines), `rollstack-eager` (whole
stack fetched before launch) and `rollstack` (on demand). Per system: `--cold` cold creations
(every cache of that system cleared, page cache dropped, then `--concurrency` creations at once)
and `--n` warm ones (caches kept, `--concurrency` at a time). Measured per creation: request ->
ready, request -> first command done, bytes fetched before ready. Writes results.json / .md /
init_cdf.png to `--out` (default results/init/).

Pure logic (`system_summary`, `comparison`) is separate from the run (`run_init`).
"""

from __future__ import annotations

import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Sequence

import typer

from rollstack_bench.systems.rollstack import ROLLSTACK_SYSTEMS, SYSTEM_NAMES, Creation, forget_shared_traces
from rollstack.errors import InvalidRequest

DEFAULT_OUT = Path("results/init")
DEFAULT_WORK = Path("/var/cache/rollstack/bench-init")
"""Own work dir (registry data, containerd, node): the corpus helper's rig uses /var/cache/rollstack/bench."""
SHARED_LAYER_CACHE = Path("/var/cache/rollstack_bench/images")
TARGETS = {"cold_speedup_p50": 20.0, "warm_init_p50_s": 0.25, "fetched_fraction": 0.02}

COLUMNS = [
    ("cold_init_p50", "cold init p50 (s)", ".2f"), ("cold_init_p95", "cold p95 (s)", ".2f"),
    ("cold_ready_p50", "cold ready p50 (s)", ".2f"),
    ("warm_init_p50", "warm init p50 (s)", ".3f"), ("warm_init_p95", "warm p95 (s)", ".3f"),
    ("warm_ready_p50", "warm ready p50 (s)", ".3f"),
    ("fetched_fraction", "fetched before ready / stack", ".2%"),
    ("cold_speedup_p50", "cold p50 speedup vs docker-eq.", ".1f"),
]


def _log(msg: str) -> None:
    print(f"[bench init] {msg}", file=sys.stderr, flush=True)


# -- pure ----------------------------------------------------------------------------------------

def parse_systems(spec: str | Sequence[str]) -> list[str]:
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    if not names:
        raise InvalidRequest("--systems: name at least one system")
    for n in names:
        if n not in SYSTEM_NAMES:
            raise InvalidRequest(f"unknown system {n!r} (one of {', '.join(SYSTEM_NAMES)})")
    return list(dict.fromkeys(names))


def system_summary(runs: Sequence[Creation], stack_bytes: int) -> dict[str, Any]:
    """interface.md's fields (init = request -> first command done) plus ready times and bytes."""
    from rollstack_bench.report import init_summary
    from rollstack.core.stats import percentile

    cold = [r for r in runs if r.cold]
    warm = [r for r in runs if not r.cold and not r.fuse_lowers]
    s: dict[str, Any] = init_summary([r.first_cmd_s for r in cold], [r.first_cmd_s for r in warm],
                                     [r.fetched_bytes for r in cold], stack_bytes)
    s["cold_ready_p50"] = percentile([r.ready_s for r in cold], 50)
    s["warm_ready_p50"] = percentile([r.ready_s for r in warm], 50)
    s["cold_fetched_bytes_p50"] = percentile([r.fetched_bytes for r in cold], 50)
    s["cold_link_bytes_p50"] = percentile([r.link_bytes for r in cold], 50)
    s["warm_fetched_bytes_p50"] = percentile([r.fetched_bytes for r in warm], 50)
    node = [r.node_fetched_bytes for r in cold if r.node_fetched_bytes >= 0]
    if node:
        s["cold_node_fetched_bytes_p50"] = percentile(node, 50)
    untraced = [r.first_cmd_s for r in cold if r.trace_prefetch_chunks == 0]
    traced = [r.first_cmd_s for r in cold if r.trace_prefetch_chunks > 0]
    if untraced:
        s["cold_first_ever_init_p50"] = percentile(untraced, 50)
    if traced:
        s["cold_stack_trace_init_p50"] = percentile(traced, 50)
    fuse = [r for r in runs if r.fuse_lowers]
    if fuse:
        s["warm_fuse_lowers_init_s"] = fuse[0].first_cmd_s
        s["warm_fuse_lowers_ready_s"] = fuse[0].ready_s
    s["stack_bytes"] = stack_bytes
    s["failures"] = sum(1 for r in runs if r.exit_code != 0)
    return s


def comparison(systems: dict[str, dict[str, Any]], base: str = "docker-equivalent") -> dict[str, Any]:
    """Adds `cold_speedup_p50` / `warm_speedup_p50` (base p50 / system p50) to each system; the targets."""
    ref = systems.get(base) or {}
    for s in systems.values():
        for kind in ("cold", "warm"):
            b, x = ref.get(f"{kind}_init_p50", math.nan), s.get(f"{kind}_init_p50", math.nan)
            s[f"{kind}_speedup_p50"] = (b / x) if (b == b and x == x and x > 0) else math.nan
    rs = systems.get("rollstack")
    if rs is None:
        return {}
    checks = {
        "cold_speedup_p50": (rs["cold_speedup_p50"], TARGETS["cold_speedup_p50"], "ge"),
        "warm_init_p50_s": (rs["warm_init_p50"], TARGETS["warm_init_p50_s"], "le"),
        "fetched_fraction": (rs["fetched_fraction"], TARGETS["fetched_fraction"], "le"),
    }
    out: dict[str, Any] = {}
    for key, (value, target, how) in checks.items():
        met = None if value != value else (value >= target if how == "ge" else value <= target)
        out[key] = {"value": value, "target": target, "met": met}
    return out


# -- the run -------------------------------------------------------------------------------------

@dataclass
class InitConfig:
    corpus: Path
    systems: list[str] = field(default_factory=lambda: list(SYSTEM_NAMES))
    profile: str = "dc"
    cold: int = 3
    warm: int = 10
    concurrency: int = 1
    work: Path = DEFAULT_WORK
    repo: str | None = None
    """repository of the stack (default: the first task's)"""
    harness: str = "mini-swe-agent"
    log: Callable[[str], None] = _log


def pick_stack(corpus: Path, repo: str | None, harness: str) -> Any:
    from rollstack_bench.systems.baselines import stacks_from_corpus
    from rollstack_corpus.build import load_corpus

    _, tasks = load_corpus(corpus)
    if repo is None:
        if not tasks:
            raise InvalidRequest(f"the corpus at {corpus} has no tasks")
        repo = tasks[0].repo
    for st in stacks_from_corpus(corpus):
        if st.repo == f"repo-{repo}" and st.harness == f"harness-{harness}":
            return st, [t for t in tasks if t.repo == repo]
    raise InvalidRequest(f"the corpus has no stack repo-{repo} + harness-{harness}")


def _rounds(n: int, c: int) -> list[int]:
    """n creations in rounds of at most c."""
    return [min(c, n - i) for i in range(0, n, c)] if n > 0 else []


def _parallel(fn: Callable[[int], Any], k: int) -> list[Any]:
    if k == 1:
        return [fn(0)]
    with ThreadPoolExecutor(max_workers=k) as pool:
        return list(pool.map(fn, range(k)))


def run_init(cfg: InitConfig) -> dict[str, Any]:
    from rollstack_bench.systems.baselines import make_system, prepare_images
    from rollstack_bench.systems.rig import BenchRig
    from rollstack_corpus.build import load_corpus
    from rollstack_bench.iteration.systems import rollstack_plan
    from rollstack_bench.systems.rollstack import first_command, publish_components, seed_layer_cache, work_lock
    from rollstack.tasks.plans import stack_groups

    log = cfg.log
    manifest, _ = load_corpus(cfg.corpus)
    stack, tasks = pick_stack(cfg.corpus, cfg.repo, cfg.harness)
    if not tasks:
        raise InvalidRequest(f"the corpus has no task for {stack.repo}")
    stack_bytes = manifest.stack_bytes(stack.components)
    cmd = first_command(stack.workdir, stack.repo.removeprefix("repo-"))
    groups = stack_groups([c.model_dump() for c in manifest.components])
    groups = type(groups)(groups.os, groups.repos, manifest.component(stack.harness).group, groups.evaluator)
    # The iteration's plans (its evaluator scores tasks/<id>.json from the evaluator group: the demo's
    # plans carry the task in the command, too long for packaging's parametrized test lists).
    plans = [rollstack_plan(t.model_dump(), groups, i) for i, t in enumerate(tasks)]
    samples: dict[str, list[Creation]] = {}
    published: list[dict[str, Any]] = []
    t_all = time.monotonic()
    with work_lock(cfg.work), BenchRig(cfg.work, cfg.profile) as rig:
        log(f"link {rig.link_facts()}; stack {stack.name}: {stack_bytes / 1e9:.2f} GB")
        baselines = [s for s in cfg.systems if s not in ROLLSTACK_SYSTEMS]
        images = {}
        if baselines:
            seed_layer_cache(cfg.work / "images", SHARED_LAYER_CACHE)
            t = time.monotonic()
            images = prepare_images([stack], rig.registry.address, cfg.work / "images")
            log(f"images pushed in {time.monotonic() - t:.1f} s")
        if any(s in ROLLSTACK_SYSTEMS for s in cfg.systems):
            t = time.monotonic()
            published = publish_components(cfg.corpus, [*stack.components, "evaluator"], rig.registry.url,
                                           f"bench-registry:{cfg.work}", cfg.work / "publish-cache.json",
                                           cfg.work / "publish-scratch", log)
            log(f"groups published in {time.monotonic() - t:.1f} s")
        for name in cfg.systems:
            log(f"{name}: {cfg.cold} cold, {cfg.warm} warm, concurrency {cfg.concurrency}")
            if name in ROLLSTACK_SYSTEMS:
                samples[name] = _run_rollstack(name, rig, cfg, plans, cmd)
            else:
                system = make_system(name, rig.ctr, rig.link, images, cfg.work / "systems")
                try:
                    samples[name] = _run_baseline(system, stack, cmd, cfg)
                finally:
                    system.clear()
            for r in samples[name]:
                if r.exit_code != 0:
                    log(f"{name}: first command exited {r.exit_code}: {r.output[-300:]}")
        link = rig.link_facts()
    systems = {n: system_summary(runs, stack_bytes) for n, runs in samples.items()}
    targets = comparison(systems)
    return {
        "systems": systems,
        "targets": targets,
        "stack": {"name": stack.name, "components": stack.components, "bytes": stack_bytes,
                  "files": manifest.stack_files(stack.components), "corpus": str(cfg.corpus),
                  "flavor": manifest.flavor},
        "first_command": cmd,
        "config": {"profile": cfg.profile, "cold": cfg.cold, "warm": cfg.warm, "concurrency": cfg.concurrency},
        "link": link,
        "published": published,
        "seconds": round(time.monotonic() - t_all, 1),
        "samples": {n: [r.to_dict() for r in runs] for n, runs in samples.items()},
    }


def _run_baseline(system: Any, stack: Any, cmd: list[str], cfg: InitConfig) -> list[Creation]:
    runs: list[Creation] = []
    for k in _rounds(cfg.cold, cfg.concurrency):
        system.clear()
        runs += [Creation.from_baseline(t, True) for t in
                 _parallel(lambda i: system._init(stack, cmd, cold=True), k)]
        cfg.log(f"{system.name} cold: " + ", ".join(f"{r.first_cmd_s:.2f}s" for r in runs[-k:]))
    if not cfg.cold:
        system.warm_init(stack, cmd)  # warm runs need the image once
    for k in _rounds(cfg.warm, cfg.concurrency):
        runs += [Creation.from_baseline(t, False) for t in _parallel(lambda i: system.warm_init(stack, cmd), k)]
    cfg.log(f"{system.name} warm: " + ", ".join(f"{r.first_cmd_s:.3f}s" for r in runs if not r.cold))
    return runs


def _run_rollstack(name: str, rig: Any, cfg: InitConfig, plans: list[dict[str, Any]], cmd: list[str]) -> list[Creation]:
    from rollstack_bench.systems.rollstack import RollstackSystem

    system = RollstackSystem(name, rig.registry.url, cfg.work / f"node-{name}", rig.link,
                             max_environments=max(16, cfg.concurrency * 2 + 4))
    runs: list[Creation] = []
    seq = iter(range(1 << 30))
    try:
        # The first cold start is a first-ever one (no access trace of this stack anywhere); the
        # later ones are new tasks on a stack an earlier (cleared) node has run: they find its
        # trace in the registry, as a second node of a cluster would.
        forget_shared_traces(rig.registry.root / "data")
        for k in _rounds(cfg.cold, cfg.concurrency):
            system.clear()
            runs += _parallel(lambda i: system.create(plans[next(seq) % len(plans)], cmd, True), k)
            cfg.log(f"{name} cold: " + ", ".join(f"{r.first_cmd_s:.2f}s ({r.fetched_bytes / 1e6:.1f} MB)" for r in runs[-k:]))
        if not cfg.cold:
            system.start()
            system.create(plans[0], cmd, False)
        if cfg.warm:
            # The stack's second environment on this node: warm caches, FUSE lowers; it makes the
            # layers hot, so the node materializes them (lowers.materialize) before the warm runs.
            first = system.create(plans[next(seq) % len(plans)], cmd, False)
            first.fuse_lowers = True
            runs.append(first)
            t0 = time.perf_counter()
            system.settle()
            cfg.log(f"{name} warm on FUSE lowers: {first.first_cmd_s:.3f}s; layers materialized in "
                    f"{time.perf_counter() - t0:.1f}s")
        for k in _rounds(cfg.warm, cfg.concurrency):
            runs += _parallel(lambda i: system.create(plans[next(seq) % len(plans)], cmd, False), k)
        cfg.log(f"{name} warm: " + ", ".join(f"{r.first_cmd_s:.3f}s" for r in runs if not r.cold and not r.fuse_lowers))
    finally:
        system.stop()
    return runs


# -- report + CLI ----------------------------------------------------------------------------------

def write_report(doc: dict[str, Any], out: Path) -> dict[str, str]:
    from rollstack_bench.report import write_results

    cdf = {f"{n} {'cold' if cold else 'warm'}": [s["first_cmd_s"] for s in runs
                                                   if s["cold"] == cold and not s.get("fuse_lowers")]
           for n, runs in doc["samples"].items() for cold in (True, False)}
    cdf = {k: v for k, v in cdf.items() if v}
    notes = [f"stack {doc['stack']['name']}: {doc['stack']['bytes'] / 1e9:.2f} GB, {doc['stack']['files']} files; "
             f"init = request -> first command done (`{doc['first_command'][-1]}`)"]
    notes += [_target_line(key, t) for key, t in doc.get("targets", {}).items()]
    return write_results(out, doc, title="bench init", columns=COLUMNS, init_samples=cdf, notes=notes)


def default_corpus(quick: bool) -> Path:
    from rollstack_corpus.build import build_corpus, corpus_dir

    if not quick and (corpus_dir("full") / "manifest.json").exists():
        return corpus_dir("full")
    root = corpus_dir("small")
    build_corpus("small", log=lambda m: _log(f"corpus: {m}"))  # cached: returns at once when built
    return root


def _target_line(key: str, t: dict[str, Any]) -> str:
    value = "-" if t.get("value") is None or t["value"] != t["value"] else f"{t['value']:.4g}"
    verdict = {True: "met", False: "MISSED", None: "not measured"}[t.get("met")]
    return f"target {key}: {value} (target {t['target']}) -> {verdict}"


def _human(doc: dict[str, Any]) -> None:
    from rollstack_bench.report import markdown_table

    print(f"command: {doc['command']}")
    m = doc["machine"]
    print(f"machine: {m.get('cpu')}, {m.get('cores')} cores, kernel {m.get('kernel')}; "
          f"stack {doc['stack']['name']} {doc['stack']['bytes'] / 1e9:.2f} GB")
    print(markdown_table(doc["systems"], COLUMNS))
    for key, t in doc.get("targets", {}).items():
        print(_target_line(key, t))
    for kind, path in doc.get("written", {}).items():
        print(f"{kind}: {path}")


def parse_node_options(items: list[str]) -> dict[str, Any]:
    """`KEY=VALUE` pairs; a VALUE that parses as JSON (numbers, true/false) is taken as such."""
    import json as _json

    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise InvalidRequest(f"--node-option takes KEY=VALUE, not {item!r}")
        try:
            out[key] = _json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def register(app: typer.Typer) -> None:
    @app.command("init")
    def bench_init(
        quick: Annotated[bool, typer.Option("--quick", help="small corpus, 1 cold + 3 warm per system (<= 5 min)")] = False,
        profile: Annotated[str, typer.Option("--profile", help="link profile: lan, dc, wan")] = "dc",
        n: Annotated[int, typer.Option("--n", min=0, help="warm creations per system")] = 10,
        cold: Annotated[int, typer.Option("--cold", min=0, help="cold creations per system")] = 3,
        concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="creations at once")] = 1,
        systems: Annotated[str, typer.Option("--systems", help="comma-separated")] = ",".join(SYSTEM_NAMES),
        corpus: Annotated[Path | None, typer.Option("--corpus", help="a built corpus directory")] = None,
        repo: Annotated[str | None, typer.Option("--repo", help="repository of the stack (default: first task's)")] = None,
        out: Annotated[Path, typer.Option("--out", help="results directory")] = DEFAULT_OUT,
        work: Annotated[Path, typer.Option("--work", help="registry/containerd/node state")] = DEFAULT_WORK,
        as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
        image: Annotated[str | None, typer.Option("--image", help="benchmark this OCI image instead of the corpus "
                                                  "(oci:DIR[:TAG] or HOST/NAME:TAG; bench/init_image.py)")] = None,
        command: Annotated[str, typer.Option("--command", help="with --image: the first command (sh -c)")] = "",
        probe: Annotated[bool, typer.Option("--probe", help="with --image: import with --probe COMMAND (the first "
                                             "cold start finds the probe's trace)")] = False,
        node_option: Annotated[list[str] | None, typer.Option("--node-option", help="with --image: KEY=VALUE, a "
                                                              "NodeConfig field of the rollstack node (repeatable; "
                                                              "e.g. erofs_lowers=false, erofs_wait=5)")] = None,
    ) -> None:
        """Environment init, cold and warm: rollstack vs docker-equivalent baselines, one run."""
        from rollstack_bench.report import _json_safe, current_command, machine_facts
        from rollstack.cli.output import emit

        if image is not None:
            from rollstack_bench.init_image import ImageInitConfig, markdown, run_init_image
            from rollstack.interrupts import sigterm_as_interrupt

            icfg = ImageInitConfig(image=image, command=command, cold=cold, warm=min(n, 3), profile=profile,
                                   work=work if work != DEFAULT_WORK else DEFAULT_WORK.with_name("bench-init-image"),
                                   log=_log, probe=probe, node_options=parse_node_options(node_option or []))
            with sigterm_as_interrupt():
                doc = run_init_image(icfg)
            doc["machine"], doc["command_line"] = machine_facts(), current_command()

            out.mkdir(parents=True, exist_ok=True)
            (out / "results-image.md").write_text(markdown(doc) + "\n")
            import json as _json

            (out / "results-image.json").write_text(_json.dumps(_json_safe(doc), indent=1))
            emit(_json_safe(doc), as_json, lambda d: print(markdown(d)))
            return

        names = parse_systems(systems)
        if quick:
            cold, n = min(cold, 1), min(n, 3)
        cfg = InitConfig(corpus=corpus or default_corpus(quick), systems=names, profile=profile, cold=cold,
                         warm=n, concurrency=concurrency, work=work, repo=repo)
        from rollstack.interrupts import sigterm_as_interrupt

        with sigterm_as_interrupt():
            doc = run_init(cfg)
        doc["machine"], doc["command"] = machine_facts(), current_command()
        doc["quick"] = quick
        doc["written"] = write_report(doc, out)
        emit(_json_safe(doc), as_json, _human)
