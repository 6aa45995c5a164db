"""`rollstack bench iteration`: one GRPO-style iteration (tasks x rollouts) per system, one run.

Every rollout: create an environment with the task's bug (init) -> start the harness
(`<entry> --version`: no model is reachable) and a scripted agent: read the buggy file, run the
failing tests, apply the reference fix, rerun them (exec) -> score in a clean evaluator
environment with the corpus's scorer (eval) -> destroy. Phase timestamps per rollout give the
timeline (iteration_timeline_<system>.png) and the share of init in the iteration.

- `rollstack`: a node on the bench registry (rollstack.bench.systems.rollstack), the plan's
  `mutation_text` and `evaluator` (os + repo + evaluator groups, `score tasks/<id>.json`).
- `docker-equivalent`: containerd + runc on the bundled image (os + repo + harness): the image is
  pulled once per repository (concurrent rollouts wait for the pull, as with `docker run`), a
  long-running container (`sleep`) per rollout, `git apply` of the bug and every agent step as
  `ctr tasks exec`; eval = a fresh container of the same image with the rollout's diff applied and
  the corpus's evaluator directory bind-mounted (the same scorer rollstack's evaluator runs).
Both start from cold caches (a fresh node: what the first iteration on a node pays).

The GRPO driver (rollstack.integrations.grpo.run_batch) is not used: its policies have no
harness step and it does not record phase timestamps; the scripted agent mirrors rollstack.demo.
"""

from __future__ import annotations

import itertools
import os
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Sequence

import typer

from rollstack.errors import InvalidRequest, RollstackError

DEFAULT_OUT = Path("results/iteration")
ITER_SYSTEMS = ("rollstack", "docker-equivalent")
EVAL_DIR = "/opt/rollstack-eval"
TARGET_INIT_SHARE = 0.05
_EOF = "ROLLSTACK_PATCH_EOF_7f3a"

COLUMNS = [
    ("iteration_s", "iteration wall (s)", ".1f"), ("rollouts", "rollouts", "d"), ("ok", "reward 1.0", "d"),
    ("init_share", "init share", ".1%"), ("env_init_share", "init share incl. evaluator env", ".1%"),
    ("exec_share", "exec share", ".1%"), ("eval_share", "eval share", ".1%"),
    ("init_p50", "init p50 (s)", ".2f"), ("init_p95", "init p95 (s)", ".2f"), ("rollout_p50", "rollout p50 (s)", ".1f"),
]


def _log(msg: str) -> None:
    print(f"[bench iteration] {msg}", file=sys.stderr, flush=True)


# -- pure ----------------------------------------------------------------------------------------

@dataclass
class Rollout:
    system: str
    task: str
    rollout: int
    phases: list[dict[str, Any]] = field(default_factory=list)
    """[{"name": init|exec|eval|destroy, "start": s, "end": s}] seconds since the iteration began"""
    reward: float | None = None
    error: str = ""
    fetched_bytes: int = 0
    steps: dict[str, int] = field(default_factory=dict)
    """exit code of each agent step"""
    eval_env_init_s: float = 0.0
    """seconds of the eval phase spent creating the evaluator environment (environment init too)"""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "label": f"{self.task}#{self.rollout}"}

    def duration(self, name: str) -> float:
        return sum(p["end"] - p["start"] for p in self.phases if p["name"] == name)


class PhaseClock:
    """Records consecutive phases of one rollout relative to the iteration's start."""

    def __init__(self, rec: Rollout, t0: float) -> None:
        self.rec, self.t0 = rec, t0

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter() - self.t0
        try:
            return fn()
        finally:
            self.rec.phases.append({"name": name, "start": start, "end": time.perf_counter() - self.t0})


def iteration_summary(rollouts: Sequence[Rollout], wall: float) -> dict[str, Any]:
    from rollstack.bench.report import percentile, phase_shares

    shares = phase_shares(r.to_dict() for r in rollouts)
    totals = [sum(p["end"] - p["start"] for p in r.phases) for r in rollouts]
    whole = sum(totals)
    env_init = sum(r.duration("init") + r.eval_env_init_s for r in rollouts)
    return {
        "env_init_share": env_init / whole if whole else float("nan"),
        "iteration_s": wall, "rollouts": len(rollouts),
        "ok": sum(1 for r in rollouts if r.reward == 1.0),
        "errors": sum(1 for r in rollouts if r.error),
        "init_share": shares.get("init", float("nan")), "exec_share": shares.get("exec", float("nan")),
        "eval_share": shares.get("eval", float("nan")), "destroy_share": shares.get("destroy", float("nan")),
        "init_p50": percentile([r.duration("init") for r in rollouts], 50),
        "init_p95": percentile([r.duration("init") for r in rollouts], 95),
        "rollout_p50": percentile(totals, 50),
        "fetched_bytes_p50": percentile([r.fetched_bytes for r in rollouts], 50),
    }


def jobs(tasks: Sequence[dict[str, Any]], n_tasks: int, rollouts: int) -> list[tuple[dict[str, Any], int]]:
    """GRPO order: the K rollouts of a task together; tasks taken round-robin over repositories
    (so a batch smaller than the corpus still spans every repository), cycled if too few."""
    if n_tasks < 1 or rollouts < 1:
        raise InvalidRequest("--tasks and --rollouts must be >= 1")
    if not tasks:
        raise InvalidRequest("the corpus has no tasks")
    by_repo: dict[str, list[dict[str, Any]]] = {}
    for t in tasks:
        by_repo.setdefault(str(t.get("repo", "")), []).append(t)
    spread = [t for group in itertools.zip_longest(*by_repo.values()) for t in group if t is not None]
    picked = list(itertools.islice(itertools.cycle(spread), n_tasks))
    return [(t, k) for t in picked for k in range(rollouts)]


def default_concurrency() -> int:
    """Rollouts in flight: two per core (rollouts wait on I/O and on each other's tests)."""
    return max(2, 2 * (os.cpu_count() or 1))


def harness_command(entry: str) -> str:
    """Start the harness without a model: the corpus's own check of it (`mini --help`: mini-swe-agent
    has no --version; `claude --version`), else `<binary> --version`."""
    parts = entry.split()
    if not parts:
        raise InvalidRequest("the harness has no entry command")
    if len(parts) == 1:
        parts.append("--version")
    return " ".join(shlex.quote(p) for p in parts)


def agent_steps(task: dict[str, Any], harness_entry: str) -> list[tuple[str, str, str | None]]:
    """(step, shell command run in the workdir, stdin) of the scripted agent."""
    ids = " ".join(shlex.quote(t) for t in task["FAIL_TO_PASS"])
    test = f"python3 -m pytest -p no:cacheprovider -q {ids}"
    path = shlex.quote(task.get("mutation", {}).get("path", "."))
    return [
        ("harness", harness_command(harness_entry), None),
        ("read", f"ls >/dev/null && head -c 65536 {path} >/dev/null", None),
        ("test_before", test, None),
        ("fix", "git apply --verbose -", task["fix"]),
        ("test_after", test, None),
    ]


def heredoc(cmd: str, stdin: str | None) -> str:
    """`cmd` with `stdin` fed from a here-document (ctr tasks exec has no stdin of ours)."""
    if stdin is None:
        return cmd
    if _EOF in stdin:
        raise InvalidRequest("patch contains the here-document marker")
    body = stdin if stdin.endswith("\n") else stdin + "\n"
    return f"{cmd} <<'{_EOF}'\n{body}{_EOF}\n"


# -- rollstack -----------------------------------------------------------------------------------

def retry_capacity(fn: Callable[[], Any], *, attempts: int = 60, delay: float = 0.5,
                   sleep: Callable[[float], None] = time.sleep) -> Any:
    """Call `fn`, retrying while the node answers insufficient_capacity (its quotas are all handed
    out to the rollouts in flight): the wait counts in the phase, as it would for a trainer."""
    for i in range(attempts):
        try:
            return fn()
        except RollstackError as exc:
            if exc.code != "insufficient_capacity" or i == attempts - 1:
                raise
            sleep(min(delay * (1.5 ** i), 5.0))
    raise AssertionError("unreachable")


def rollstack_rollout(node: Any, plan: dict[str, Any], task: dict[str, Any], k: int, entry: str, t0: float) -> Rollout:
    rec = Rollout("rollstack", task["instance_id"], k)
    clock = PhaseClock(rec, t0)
    env = None
    try:
        env = clock.run("init", lambda: retry_capacity(lambda: node.create(plan)))
        rec.fetched_bytes = int(env.created.fetch.fetched_bytes)

        def agent() -> None:
            for name, cmd, stdin in agent_steps(task, entry):
                rec.steps[name] = env.exec(cmd, timeout=600, stdin=stdin).exit_code

        clock.run("exec", agent)
        ev = clock.run("eval", lambda: retry_capacity(env.evaluate))
        rec.reward = float(ev.reward)
        rec.eval_env_init_s = float(ev.timings.get("create", 0.0))
    except RollstackError as exc:
        rec.error = f"{exc.code}: {exc.message or exc.code}"
    except Exception as exc:  # noqa: BLE001 - recorded; the run reports errors
        rec.error = f"{type(exc).__name__}: {exc}"
    finally:
        if env is not None:
            try:
                clock.run("destroy", env.destroy)
            except Exception as exc:  # noqa: BLE001
                rec.error = rec.error or f"destroy_failed: {exc}"
    return rec


def rollstack_plan(task: dict[str, Any], groups: Any, k: int) -> dict[str, Any]:
    """demo's rollout plan, its evaluator scoring the task file installed in the evaluator group."""
    from rollstack.corpus.plans import rollout_plan

    return rollout_plan(task, groups, k, evaluator=[f"{EVAL_DIR}/score", f"{EVAL_DIR}/tasks/{task['instance_id']}.json"])


# -- docker-equivalent ---------------------------------------------------------------------------

class ContainerdRollouts:
    """docker-equivalent rollouts on the bench rig's containerd (see the module docstring)."""

    _ids = itertools.count()

    def __init__(self, ctr: Any, images: dict[str, Any], stacks: dict[str, Any], eval_dir: Path) -> None:
        self.ctr, self.images, self.stacks, self.eval_dir = ctr, images, stacks, eval_dir
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _ensure_image(self, ref: str) -> None:
        with self._guard:
            lock = self._locks.setdefault(ref, threading.Lock())
        with lock:  # one pull per image; the others wait for it (docker dedupes concurrent pulls too)
            if not self.ctr.has_image(ref):
                self.ctr.pull(ref)

    def _exec(self, cid: str, workdir: str, cmd: str, stdin: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        script = heredoc(f"cd {shlex.quote(workdir)} && {cmd}", stdin)
        argv = self.ctr._cmd("tasks", "exec", "--exec-id", f"x{next(self._ids)}", cid, "/bin/sh", "-c", script)
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def rollout(self, task: dict[str, Any], k: int, entry: str, t0: float) -> Rollout:
        rec = Rollout("docker-equivalent", task["instance_id"], k)
        clock = PhaseClock(rec, t0)
        stack = self.stacks[task["repo"]]
        ref = self.images[stack.name].bundled
        n = next(self._ids)
        cid, eval_cid = f"rsi-{os.getpid()}-{n}", f"rsi-{os.getpid()}-{n}-eval"
        wd = task["workdir"]
        try:
            def init() -> None:
                self._ensure_image(ref)
                self.ctr.create(ref, cid, ["sleep", "infinity"])
                self.ctr.run("tasks", "start", "-d", cid)
                p = self._exec(cid, wd, "git apply -", task["patch"])
                if p.returncode != 0:
                    raise RuntimeError(f"mutation failed: {p.stderr[-300:]}")

            clock.run("init", init)

            def agent() -> None:
                for name, cmd, stdin in agent_steps(task, entry):
                    rec.steps[name] = self._exec(cid, wd, cmd, stdin).returncode

            clock.run("exec", agent)

            def evaluate() -> float:
                diff = self._exec(cid, wd, "git diff --binary HEAD").stdout
                apply = heredoc("git apply -", diff) if diff.strip() else "true"
                script = (f"cd {shlex.quote(wd)} && {apply.rstrip()}\n"
                          f"exec {EVAL_DIR}/score {EVAL_DIR}/tasks/{task['instance_id']}.json\n")
                t = time.perf_counter()
                self.ctr.create(ref, eval_cid, ["/bin/sh", "-c", script], [(str(self.eval_dir), EVAL_DIR)])
                rec.eval_env_init_s = time.perf_counter() - t
                return 1.0 if self.ctr.start(eval_cid).returncode == 0 else 0.0

            rec.reward = clock.run("eval", evaluate)
        except Exception as exc:  # noqa: BLE001 - recorded; the run reports errors
            rec.error = f"{type(exc).__name__}: {str(exc)[-300:]}"
        finally:
            def destroy() -> None:
                for c in (cid, eval_cid):
                    self.ctr.run("tasks", "kill", "-s", "SIGKILL", c, check=False)
                    self.ctr.delete(c)

            clock.run("destroy", destroy)
        return rec


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
    from rollstack.bench.systems.baselines import prepare_images, stacks_from_corpus
    from rollstack.bench.systems.rig import BenchRig
    from rollstack.bench.systems.containerd import drop_page_cache
    from rollstack.corpus.build import load_corpus
    from rollstack.bench.init import SHARED_LAYER_CACHE
    from rollstack.bench.systems.rollstack import RollstackSystem, work_lock, publish_components, seed_layer_cache
    from rollstack.corpus.plans import stack_groups

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

def write_report(doc: dict[str, Any], out: Path) -> dict[str, str]:
    from rollstack.bench.report import plot_timeline, write_results

    out.mkdir(parents=True, exist_ok=True)
    plots = {}
    for name, rs in doc["rollouts"].items():
        p = plot_timeline(rs, out / f"iteration_timeline_{name}.png", title=f"iteration timeline: {name}")
        plots[name] = str(p)
    notes = [f"![{n} timeline]({Path(p).name})" for n, p in plots.items()]
    for key, t in doc.get("targets", {}).items():
        v = t["value"]
        notes.append(f"target {key}: {'-' if v != v else f'{v:.1%}'} (target <= {t['target']:.0%}) -> "
                     f"{ {True: 'met', False: 'MISSED', None: 'not measured'}[t['met']] }")
    written = write_results(out, doc, title="bench iteration", columns=COLUMNS, notes=notes)
    written.update({f"timeline_{n}": p for n, p in plots.items()})
    return written


def _human(doc: dict[str, Any]) -> None:
    from rollstack.bench.report import markdown_table

    print(f"command: {doc['command']}")
    print(markdown_table(doc["systems"], COLUMNS))
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
    ) -> None:
        """A GRPO-style iteration per system: init / exec / eval timeline, share of init."""
        from rollstack.bench.init import default_corpus
        from rollstack.bench.report import _json_safe, current_command, machine_facts
        from rollstack.cli.output import emit

        if quick:
            tasks, rollouts = min(tasks, 2), min(rollouts, 2)
        names = [s.strip() for s in systems.split(",") if s.strip()]
        cfg = IterConfig(corpus=corpus or default_corpus(quick), tasks=tasks, rollouts=rollouts,
                         concurrency=concurrency or default_concurrency(), systems=names, profile=profile, work=work)
        from rollstack.interrupts import sigterm_as_interrupt

        with sigterm_as_interrupt():
            doc = run_iteration(cfg)
        doc["machine"], doc["command"] = machine_facts(), current_command()
        doc["written"] = write_report(doc, out)
        emit(_json_safe(doc), as_json, _human)
