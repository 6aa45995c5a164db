"""`rollstack bench iteration --image REF [--image REF2 ...]`: a GRPO-style iteration on imported
images, rollstack vs the docker-equivalent, cold and warm, side by side in one run.

Each image is imported as a layer group into the bench registry and pushed there unchanged for
containerd (`bench.init_image.import_bench_image`, the same as `bench init --image`). The tasks
and agent steps are `image_tasks`' (a generated file per task; walk, the image's command, file
reads, CPU, a write; evaluation in a second clean environment). Per system, two iterations:

- **cold**: rollstack on a fresh node (lazy-store state, resolve cache and materialized layers
  removed, page cache dropped) with no access trace of the images in the registry (first-ever);
  containerd with every image, blob and snapshot removed and the page cache dropped: the first
  rollout of each image pulls and unpacks it (the others wait, as `docker run` does);
- **warm**: right after, on the same node / the same containerd (images present, caches warm).

rollstack: `node.create(plan)` (mutation = the task's diff, evaluator = the image's group), each
step `env.exec`, `env.evaluate()` (the rollout's diff applied in a fresh environment), destroy.
containerd: a `sleep infinity` container, the task file written through `ctr tasks exec`, each
step `ctr tasks exec`; eval = a fresh container of the image (`ctr run`'s create + start) that
unpacks the rollout's task directory (tar | base64 out of the rollout container) and runs the
evaluator's command. Phase timestamps per rollout as in the corpus iteration.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rollstack_bench.iteration.image_tasks import (TASK_DIR, TASK_FILE, in_task_dir, make_tasks, phase_medians,
                                                   ratios)
from rollstack_bench.iteration.rollout import (PhaseClock, Rollout, default_concurrency, heredoc,
                                              iteration_summary, jobs)
from rollstack_bench.iteration.systems import CtrRollouts, run_rollout
from rollstack.errors import InvalidRequest

MODES = ("cold", "warm")
SYSTEMS = ("rollstack", "docker-equivalent")
RESOURCES = {"cpu": 1.0, "memory": "1Gi", "max_cpu": 2.0, "max_memory": "4Gi"}
"""start quotas and caps of a rollout's environment (containerd's containers have none)"""


@dataclass
class ImageIterConfig:
    images: list[str]
    commands: list[str] = field(default_factory=list)
    task_commands: list[str] = field(default_factory=list)
    eval_command: str | None = None
    tasks: int = 4
    rollouts: int = 4
    concurrency: int = field(default_factory=default_concurrency)
    systems: list[str] = field(default_factory=lambda: list(SYSTEMS))
    modes: list[str] = field(default_factory=lambda: list(MODES))
    profile: str = "dc"
    work: Path = Path("/var/cache/rollstack/bench-iteration-image")
    log: Callable[[str], None] = print


# -- one rollout per system ----------------------------------------------------------------------

def image_plan(task: dict[str, Any], group: str, k: int) -> dict[str, Any]:
    return {"name": f"{task['instance_id']}-{k}", "groups": [group], "workdir": "/",
            "mutation_text": task["mutation"], "resources": RESOURCES,
            "evaluator": {"groups": [group], "command": task["eval"], "reward": "exit_code"}}


def rollstack_image_rollout(node: Any, group: str, task: dict[str, Any], k: int, t0: float) -> Rollout:
    steps = [(name, in_task_dir(cmd), None) for name, cmd in task["steps"]]
    return run_rollout(node, image_plan(task, group, k), task["instance_id"], k, steps, t0, failed_eval_is_error=True)


class CtrImageRollouts(CtrRollouts):
    """docker-equivalent rollouts of image tasks (see the module docstring)."""

    def __init__(self, ctr: Any, refs: dict[str, str]) -> None:
        super().__init__(ctr)
        self.refs = refs  # image reference -> what containerd pulls

    def rollout(self, task: dict[str, Any], k: int, t0: float) -> Rollout:
        rec = Rollout("docker-equivalent", task["instance_id"], k)
        clock = PhaseClock(rec, t0)
        ref = self.refs[task["image"]]
        cid, eval_cid = self._names()

        def init() -> None:
            self._start_idle(ref, cid)
            p = self._exec(cid, "/", f"mkdir -p {TASK_DIR} && cat > {TASK_DIR}/{TASK_FILE}", task["text"])
            if p.returncode != 0:
                raise RuntimeError(f"mutation failed: {p.stderr[-300:]}")

        def evaluate() -> float:
            packed = self._exec(cid, "/", f"tar -cf - {TASK_DIR.lstrip('/')} | base64")
            if packed.returncode != 0:
                raise RuntimeError(f"packing the rollout's changes failed: {packed.stderr[-300:]}")
            # the group reads the here-document (on a pipeline it would feed only the last command)
            script = heredoc("{ base64 -d | tar -C / -xf -; }", packed.stdout) + task["eval"] + "\n"
            t = time.perf_counter()
            self.ctr.create(ref, eval_cid, ["/bin/sh", "-c", script])
            rec.eval_env_init_s = time.perf_counter() - t
            t = time.perf_counter()
            proc = self.ctr.start(eval_cid)
            rec.eval_cmd_s = time.perf_counter() - t
            if proc.returncode != 0:
                rec.error = f"evaluation failed (exit {proc.returncode}): {(proc.stdout + proc.stderr)[-300:]}"
            return 1.0 if proc.returncode == 0 else 0.0

        steps = [(name, cmd, None) for name, cmd in task["steps"]]
        return self._phases(rec, clock, init, lambda: self._steps(rec, cid, TASK_DIR, steps), evaluate, (cid, eval_cid))


# -- the run -------------------------------------------------------------------------------------

def run_image_iteration(cfg: ImageIterConfig) -> dict[str, Any]:
    from rollstack_bench.init_image import import_bench_image
    from rollstack_bench.iteration import _drive
    from rollstack_bench.systems.containerd import drop_page_cache
    from rollstack_bench.systems.rig import BenchRig
    from rollstack_bench.systems.rollstack import RollstackSystem, forget_shared_traces, work_lock

    for s in cfg.systems:
        if s not in SYSTEMS:
            raise InvalidRequest(f"unknown system {s!r} for bench iteration (one of {', '.join(SYSTEMS)})")
    for m in cfg.modes:
        if m not in MODES:
            raise InvalidRequest(f"unknown mode {m!r} (one of {', '.join(MODES)})")
    log = cfg.log
    per_image = max(1, -(-cfg.tasks // len(cfg.images))) if cfg.images else 1
    tasks = make_tasks(cfg.images, cfg.commands, per_image, cfg.task_commands, cfg.eval_command)
    work_list = jobs(tasks, cfg.tasks, cfg.rollouts)
    results: dict[str, dict[str, list[Rollout]]] = {}
    walls: dict[str, dict[str, float]] = {}
    with work_lock(cfg.work), BenchRig(cfg.work, cfg.profile) as rig:
        imported = {ref: import_bench_image(rig, ref, cfg.work, reimport=False, log=log) for ref in cfg.images}
        log(f"{len(work_list)} rollouts ({cfg.tasks} tasks x {cfg.rollouts}) over {len(cfg.images)} image(s), "
            f"concurrency {cfg.concurrency}, modes {cfg.modes}")
        for name in cfg.systems:
            results[name], walls[name] = {}, {}
            if name == "rollstack":
                system = RollstackSystem("rollstack", rig.registry.url, cfg.work / "node-iteration", rig.link,
                                         max_environments=max(16, 2 * cfg.concurrency + 4))
                groups = {ref: b.group for ref, b in imported.items()}
                fn = lambda job, t0: rollstack_image_rollout(system.node, groups[job[0]["image"]], job[0], job[1], t0)
                try:
                    for mode in cfg.modes:
                        if mode == "cold":
                            forget_shared_traces(rig.registry.root / "data")
                            system.clear()  # fresh node, page cache dropped
                        else:
                            system.start()
                        results[name][mode], walls[name][mode] = _drive(work_list, fn, cfg, f"{name}-{mode}")
                finally:
                    system.stop()
            else:
                runner = CtrImageRollouts(rig.ctr, {ref: b.ctr_ref for ref, b in imported.items()})
                try:
                    for mode in cfg.modes:
                        if mode == "cold":
                            rig.ctr.clear()
                            drop_page_cache()
                        results[name][mode], walls[name][mode] = _drive(
                            work_list, lambda job, t0: runner.rollout(job[0], job[1], t0), cfg, f"{name}-{mode}")
                finally:
                    rig.ctr.clear()
        link = rig.link_facts()
    return image_report(results, walls, cfg, {ref: b.import_doc for ref, b in imported.items()}, link)


def image_report(results: dict[str, dict[str, list[Rollout]]], walls: dict[str, dict[str, float]],
                 cfg: ImageIterConfig, imports: dict[str, Any], link: dict[str, Any]) -> dict[str, Any]:
    systems: dict[str, Any] = {}
    for name, by_mode in results.items():
        for mode, rs in by_mode.items():
            dicts = [r.to_dict() for r in rs]
            systems[f"{name}-{mode}"] = {**iteration_summary(rs, walls[name][mode]), **phase_medians(dicts),
                                         "system": name, "mode": mode}
    compare = {mode: ratios(systems[f"rollstack-{mode}"], systems[f"docker-equivalent-{mode}"])
               for mode in cfg.modes if f"rollstack-{mode}" in systems and f"docker-equivalent-{mode}" in systems}
    return {
        "systems": systems,
        "ratios": compare,
        "config": {"images": cfg.images, "tasks": cfg.tasks, "rollouts": cfg.rollouts, "concurrency": cfg.concurrency,
                   "profile": cfg.profile, "modes": cfg.modes, "task_commands": cfg.task_commands,
                   "commands": cfg.commands, "eval_command": cfg.eval_command, "resources": RESOURCES},
        "imports": imports,
        "link": link,
        "rollouts": {f"{n}-{m}": [r.to_dict() for r in rs] for n, by in results.items() for m, rs in by.items()},
    }


# -- report ---------------------------------------------------------------------------------------

COLUMNS = [
    ("iteration_s", "iteration wall (s)", ".1f"), ("rollouts", "rollouts", "d"), ("ok", "reward 1.0", "d"),
    ("init_share", "init share", ".1%"), ("env_init_share", "init share incl. evaluator env", ".1%"),
    ("init_p50", "init p50 (s)", ".2f"), ("exec_p50", "exec p50 (s)", ".2f"), ("eval_p50", "eval p50 (s)", ".2f"),
    ("eval_cmd_p50", "eval command p50 (s)", ".2f"), ("fuse_lowers", "rollouts on FUSE lowers", "d"),
]


def _x(v: float | None) -> str:
    return "-" if v is None or v != v else f"{v:.2f}x"


def ratio_lines(doc: dict[str, Any]) -> list[str]:
    """The rollstack / containerd ratios as markdown (per mode: phases, then each step)."""
    out = []
    for mode, r in doc.get("ratios", {}).items():
        head = ", ".join(f"{k.removesuffix('_p50')} {_x(r[k])}" for k in ("iteration_s", "init_p50", "exec_p50",
                                                                         "eval_p50", "eval_cmd_p50"))
        out.append(f"{mode}: rollstack / docker-equivalent: {head}")
        out.append("  per command (p50): " + ", ".join(f"{k} {_x(v)}" for k, v in r["steps"].items()))
        if r.get("steps_net"):
            out.append("  per command net of the exec path (p50 - noop p50): "
                       + ", ".join(f"{k} {_x(v)}" for k, v in r["steps_net"].items()))
    return out


def write_image_report(doc: dict[str, Any], out: Path) -> dict[str, str]:
    from rollstack_bench.iteration import write_report

    return write_report(doc, out, title="bench iteration --image", columns=COLUMNS, notes=ratio_lines(doc))


def human(doc: dict[str, Any]) -> None:
    from rollstack_bench.iteration import _human

    _human(doc, COLUMNS, ratio_lines(doc))
