"""`rollstack bench iteration`: one GRPO-style iteration (tasks x rollouts) per system, one run.

Every rollout: create an environment with the task's bug (init) -> start the harness
(`<entry> --version`: no model is reachable) and a scripted agent: read the buggy file, run the
failing tests, apply the reference fix, rerun them (exec) -> score in a clean evaluator
environment with the corpus's scorer (eval) -> destroy. Phase timestamps per rollout give the
timeline (iteration_timeline_<system>.png) and the share of init in the iteration.

- `rollstack`: a node on the bench registry (rollstack_bench.systems.rollstack), the plan's
  `mutation_text` and `evaluator` (os + repo + evaluator groups, `score tasks/<id>.json`).
- `docker-equivalent`: containerd + runc on the bundled image (os + repo + harness): the image is
  pulled once per repository (concurrent rollouts wait for the pull, as with `docker run`), a
  long-running container (`sleep`) per rollout, `git apply` of the bug and every agent step as
  `ctr tasks exec`; eval = a fresh container of the same image with the rollout's diff applied and
  the corpus's evaluator directory bind-mounted (the same scorer rollstack's evaluator runs).
Both start from cold caches (a fresh node: what the first iteration on a node pays).

The GRPO driver (rollstack.integrations.grpo.run_batch) is not used: its policies have no
harness step and it does not record phase timestamps; the scripted agent mirrors rollstack_demo.

Code: `rollout` (the rollout record, summary and scripted agent: pure), `systems` (one rollout
on rollstack / on containerd), this module (the run, its report and the command).
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Sequence

import typer

from rollstack_bench.iteration.rollout import Rollout, default_concurrency, iteration_summary, jobs
from rollstack_bench.iteration.systems import ContainerdRollouts, rollstack_plan, rollstack_rollout
from rollstack.errors import InvalidRequest
from rollstack.tasks.plans import EVAL_DIR

DEFAULT_OUT = Path("results/iteration")
ITER_SYSTEMS = ("rollstack", "docker-equivalent")
TARGET_INIT_SHARE = 0.05

COLUMNS = [
    ("iteration_s", "iteration wall (s)", ".1f"), ("rollouts", "rollouts", "d"), ("ok", "reward 1.0", "d"),
    ("init_share", "init share", ".1%"), ("env_init_share", "init share incl. evaluator env", ".1%"),
    ("exec_share", "exec share", ".1%"), ("eval_share", "eval share", ".1%"),
    ("init_p50", "init p50 (s)", ".2f"), ("init_p95", "init p95 (s)", ".2f"), ("rollout_p50", "rollout p50 (s)", ".1f"),
]


def _log(msg: str) -> None:
    print(f"[bench iteration] {msg}", file=sys.stderr, flush=True)


# -- the run -------------------------------------------------------------------------------------

@dataclass
class IterConfig:
    corpus: Path
    tasks: int = 32
    rollouts: int = 8
    concurrency: int = field(default_factory=default_concurrency)
    systems: list[str] = field(default_factory=lambda: list(ITER_SYSTEMS))
    profile: str = "dc"
    work: Path = Path("/var/cache/rollstack/bench-init")
    harness: str = "mini-swe-agent"
    log: Callable[[str], None] = _log


def run_iteration(cfg: IterConfig) -> dict[str, Any]:
    from rollstack_bench.systems.baselines import prepare_images, stacks_from_corpus
    from rollstack_bench.systems.rig import BenchRig
    from rollstack_bench.systems.containerd import drop_page_cache
    from rollstack_corpus.build import load_corpus
    from rollstack_bench.init import SHARED_LAYER_CACHE
    from rollstack_bench.systems.rollstack import RollstackSystem, work_lock, publish_components, seed_layer_cache
    from rollstack.tasks.plans import stack_groups

    for s in cfg.systems:
        if s not in ITER_SYSTEMS:
            raise InvalidRequest(f"unknown system {s!r} for bench iteration (one of {', '.join(ITER_SYSTEMS)})")
    log = cfg.log
    manifest, all_tasks = load_corpus(cfg.corpus)
    work_list = jobs([t.model_dump() for t in all_tasks], cfg.tasks, cfg.rollouts)
    repos = sorted({t["repo"] for t, _ in work_list})
    harness = manifest.component(f"harness-{cfg.harness}")
    entry = str(harness.info.get("entry") or "")
    groups = stack_groups([c.model_dump() for c in manifest.components])
    groups = type(groups)(groups.os, groups.repos, harness.group, groups.evaluator)
    stacks = {st.repo.removeprefix("repo-"): st for st in stacks_from_corpus(cfg.corpus)
              if st.harness == harness.name and st.repo.removeprefix("repo-") in repos}
    results: dict[str, list[Rollout]] = {}
    walls: dict[str, float] = {}
    with work_lock(cfg.work), BenchRig(cfg.work, cfg.profile) as rig:
        log(f"{len(work_list)} rollouts ({cfg.tasks} tasks x {cfg.rollouts}) over repos {repos}, "
            f"concurrency {cfg.concurrency}")
        for name in cfg.systems:
            if name == "rollstack":
                comps = ["os", *(f"repo-{r}" for r in repos), harness.name, "evaluator"]
                publish_components(cfg.corpus, comps, rig.registry.url, f"bench-registry:{cfg.work}",
                                   cfg.work / "publish-cache.json", cfg.work / "publish-scratch", log)
                system = RollstackSystem("rollstack", rig.registry.url, cfg.work / "node-iteration", rig.link,
                                         max_environments=max(16, 2 * cfg.concurrency + 4))
                try:
                    system.clear()  # cold: a fresh node
                    fn = lambda job, t0: rollstack_rollout(system.node, rollstack_plan(job[0], groups, job[1]),
                                                           job[0], job[1], entry, t0)
                    results[name], walls[name] = _drive(work_list, fn, cfg, name)
                finally:
                    system.stop()
            else:
                seed_layer_cache(cfg.work / "images", SHARED_LAYER_CACHE)
                images = prepare_images(list(stacks.values()), rig.registry.address, cfg.work / "images")
                runner = ContainerdRollouts(rig.ctr, images, stacks, cfg.corpus / "evaluator" / EVAL_DIR.lstrip("/"))
                rig.ctr.clear()
                drop_page_cache()
                try:
                    results[name], walls[name] = _drive(work_list, lambda job, t0: runner.rollout(job[0], job[1], entry, t0),
                                                        cfg, name)
                finally:
                    rig.ctr.clear()
        link = rig.link_facts()
    systems = {n: iteration_summary(rs, walls[n]) for n, rs in results.items()}
    target = None
    if "rollstack" in systems:  # environment init = the rollout's and the evaluator's environments
        share = systems["rollstack"]["env_init_share"]
        target = {"value": share, "target": TARGET_INIT_SHARE, "met": share <= TARGET_INIT_SHARE if share == share else None}
    return {
        "systems": systems,
        "targets": {"env_init_share": target} if target else {},
        "config": {"tasks": cfg.tasks, "rollouts": cfg.rollouts, "concurrency": cfg.concurrency,
                   "profile": cfg.profile, "harness": harness.group, "corpus": str(cfg.corpus),
                   "flavor": manifest.flavor},
        "link": link,
        "rollouts": {n: [r.to_dict() for r in rs] for n, rs in results.items()},
    }


def _drive(work_list: list[tuple[dict[str, Any], int]], fn: Callable[[Any, float], Rollout], cfg: IterConfig,
           name: str) -> tuple[list[Rollout], float]:
    t0 = time.perf_counter()
    out: list[Rollout] = []
    with ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix=f"rollout-{name}") as pool:
        futures = [pool.submit(fn, job, t0) for job in work_list]
        try:
            for f in futures:
                rec = f.result()
                out.append(rec)
                if rec.error or len(out) % 8 == 0 or len(out) == len(work_list):
                    cfg.log(f"{name} [{len(out)}/{len(work_list)}] {rec.task}#{rec.rollout}: init "
                            f"{rec.duration('init'):.2f}s reward {rec.reward} {rec.error}")
        except BaseException:  # Ctrl-C: start no new rollout; the ones in flight finish and clean up
            for f in futures:
                f.cancel()
            raise
    return out, time.perf_counter() - t0


# -- report + CLI ----------------------------------------------------------------------------------

def write_report(doc: dict[str, Any], out: Path, *, title: str = "bench iteration",
                 columns: Sequence[tuple[str, str, str]] = COLUMNS, notes: Sequence[str] = ()) -> dict[str, str]:
    from rollstack_bench.report import plot_timeline, write_results

    out.mkdir(parents=True, exist_ok=True)
    plots = {}
    for name, rs in doc["rollouts"].items():
        p = plot_timeline(rs, out / f"iteration_timeline_{name}.png", title=f"iteration timeline: {name}")
        plots[name] = str(p)
    notes = [*notes, *(f"![{n} timeline]({Path(p).name})" for n, p in plots.items())]
    for key, t in doc.get("targets", {}).items():
        v = t["value"]
        notes.append(f"target {key}: {'-' if v != v else f'{v:.1%}'} (target <= {t['target']:.0%}) -> "
                     f"{ {True: 'met', False: 'MISSED', None: 'not measured'}[t['met']] }")
    written = write_results(out, doc, title=title, columns=columns, notes=notes)
    written.update({f"timeline_{n}": p for n, p in plots.items()})
    return written


def _human(doc: dict[str, Any], columns: Sequence[tuple[str, str, str]] = COLUMNS, lines: Sequence[str] = ()) -> None:
    from rollstack_bench.report import markdown_table

    print(f"command: {doc['command']}")
    print(markdown_table(doc["systems"], columns))
    for line in lines:
        print(line)
    for key, t in doc.get("targets", {}).items():
        print(f"target {key}: {t['value']} (target {t['target']}) -> {t['met']}")
    for kind, path in doc.get("written", {}).items():
        print(f"{kind}: {path}")


def register(app: typer.Typer) -> None:
    @app.command("iteration")
    def bench_iteration(
        quick: Annotated[bool, typer.Option("--quick", help="small corpus, 2 tasks x 2 rollouts")] = False,
        tasks: Annotated[int, typer.Option("--tasks", min=1, help="tasks in the iteration")] = 32,
        rollouts: Annotated[int, typer.Option("--rollouts", min=1, help="rollouts per task")] = 8,
        concurrency: Annotated[int, typer.Option("--concurrency", min=0, help="rollouts in flight (0: 2 per core)")] = 0,
        systems: Annotated[str, typer.Option("--systems", help="comma-separated")] = ",".join(ITER_SYSTEMS),
        profile: Annotated[str, typer.Option("--profile", help="link profile: lan, dc, wan")] = "dc",
        corpus: Annotated[Path | None, typer.Option("--corpus", help="a built corpus directory")] = None,
        out: Annotated[Path, typer.Option("--out", help="results directory")] = DEFAULT_OUT,
        work: Annotated[Path, typer.Option("--work", help="registry/containerd/node state")] = Path("/var/cache/rollstack/bench-init"),
        as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
        image: Annotated[list[str] | None, typer.Option("--image", help="iterate on this OCI image instead of the "
                                                        "corpus (oci:DIR[:TAG] or HOST/NAME:TAG; repeatable)")] = None,
        command: Annotated[list[str] | None, typer.Option("--command", help="with --image: the image's command (sh -c; "
                                                          "once, or once per --image; default: bench.images')")] = None,
        task_command: Annotated[list[str] | None, typer.Option("--task-command", help="with --image: an agent step "
                                                               "(repeatable; default: walk, --command, read, cpu)")] = None,
        eval_command: Annotated[str | None, typer.Option("--eval-command", help="with --image: run in the evaluator "
                                                         "after the answer check (default: --command)")] = None,
        modes: Annotated[str, typer.Option("--modes", help="with --image: cold,warm (comma-separated)")] = "cold,warm",
    ) -> None:
        """A GRPO-style iteration per system: init / exec / eval timeline, share of init."""
        from rollstack_bench.init import default_corpus
        from rollstack_bench.report import _json_safe, current_command, machine_facts
        from rollstack.cli.output import emit

        if quick:
            tasks, rollouts = min(tasks, 2), min(rollouts, 2)
        names = [s.strip() for s in systems.split(",") if s.strip()]
        if image:
            from rollstack_bench.iteration.image_run import ImageIterConfig, human, run_image_iteration, write_image_report
            from rollstack.interrupts import sigterm_as_interrupt

            icfg = ImageIterConfig(images=list(image), commands=list(command or []), task_commands=list(task_command or []),
                                   eval_command=eval_command, tasks=tasks, rollouts=rollouts,
                                   concurrency=concurrency or default_concurrency(), systems=names,
                                   modes=[m.strip() for m in modes.split(",") if m.strip()], profile=profile,
                                   work=work if work != Path("/var/cache/rollstack/bench-init")
                                   else Path("/var/cache/rollstack/bench-iteration-image"), log=_log)
            with sigterm_as_interrupt():
                doc = run_image_iteration(icfg)
            doc["machine"], doc["command"] = machine_facts(), current_command()
            doc["written"] = write_image_report(doc, out if out != DEFAULT_OUT else DEFAULT_OUT.with_name("iteration-image"))
            emit(_json_safe(doc), as_json, human)
            return
        cfg = IterConfig(corpus=corpus or default_corpus(quick), tasks=tasks, rollouts=rollouts,
                         concurrency=concurrency or default_concurrency(), systems=names, profile=profile, work=work)
        from rollstack.interrupts import sigterm_as_interrupt

        with sigterm_as_interrupt():
            doc = run_iteration(cfg)
        doc["machine"], doc["command"] = machine_facts(), current_command()
        doc["written"] = write_report(doc, out)
        emit(_json_safe(doc), as_json, _human)
