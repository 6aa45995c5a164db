"""`rollstack bench exec`: the same commands in fresh rollstack environments and fresh containerd
containers, interleaved rep by rep, on one corpus stack (where `bench iteration` loses or wins
execution time, measured without the iteration's init and scheduling noise).

Each rep creates `concurrency` rollstack environments and `concurrency` docker-equivalent
containers (bug applied, like a rollout), runs every command of `COMMANDS` in each (the
environments concurrently), and destroys them. Per command and system: wall p50; per rep on
rollstack: the lazy store daemon's CPU seconds and FUSE requests, and whether the environment
stacked FUSE lowers or materialized directories. `--lowers fuse` keeps every layer on FUSE
(materialization and EROFS mounts off), `erofs` stacks each layer's EROFS mount over the lazy
store's blob (lowers/erofs.py; materialization off), `materialized` materializes the stack first,
`node` (default) is what a node does by itself (EROFS mounts after the first use, materialize
after 2 uses, while the reps run).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable

import typer

from rollstack.errors import InvalidRequest


def _log(msg: str) -> None:
    print(f"[bench exec] {msg}", file=sys.stderr, flush=True)


def commands(task: dict[str, Any], test_command: str) -> dict[str, str]:
    from rollstack.tasks.plans import failing_tests_command

    return {
        "failing_tests": f"PYTHONDONTWRITEBYTECODE=1 {failing_tests_command(task)}",
        "test_files": f"PYTHONDONTWRITEBYTECODE=1 {test_command}",
        "find_usr": "find /usr -xdev | wc -l",
        "read_py": "find / -xdev -name '*.py' -type f -print0 2>/dev/null | xargs -0 cat | wc -c",
        "git_status": "git status --porcelain | wc -l",
    }


def proc_cpu(pid: int) -> float:
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Pure: per system and command the p50/min/max wall, and the rollstack/containerd ratio."""
    out: dict[str, Any] = {}
    by: dict[tuple[str, str], list[float]] = {}
    for s in samples:
        for cmd, t in s["commands"].items():
            by.setdefault((s["system"], cmd), []).append(t)
    for (system, cmd), ts in sorted(by.items()):
        out.setdefault(system, {})[cmd] = {"p50": statistics.median(ts), "min": min(ts), "max": max(ts), "n": len(ts)}
    base = out.get("docker-equivalent")
    for system in [k for k in out if k.startswith("rollstack")]:
        if base:
            key = "ratio" if system == "rollstack" else f"ratio_{system.removeprefix('rollstack-')}"
            out[key] = {c: out[system][c]["p50"] / base[c]["p50"] for c in out[system] if c in base and base[c]["p50"] > 0}
    return out


@dataclass
class ExecConfig:
    corpus: Path
    reps: int = 3
    concurrency: int = 1
    lowers: str = "node"
    profile: str = "dc"
    work: Path = Path("/var/cache/rollstack/bench-init")
    only: list[str] = field(default_factory=list)
    baseline: bool = True
    nolinger: bool = False
    """also a node whose FUSE fast path does not wait for the next request (fuse_linger_us 0)"""
    log: Callable[[str], None] = _log


def run_exec(cfg: ExecConfig) -> dict[str, Any]:
    from rollstack_bench.systems.baselines import prepare_images, stacks_from_corpus
    from rollstack_bench.systems.rig import BenchRig
    from rollstack_corpus.build import load_corpus
    from rollstack_bench.init import SHARED_LAYER_CACHE
    from rollstack.tasks.plans import EVAL_DIR
    from rollstack_bench.iteration.systems import ContainerdRollouts, rollstack_plan
    from rollstack_bench.systems.rollstack import RollstackSystem, publish_components, seed_layer_cache, work_lock
    from rollstack.tasks.plans import stack_groups

    if cfg.lowers not in ("node", "fuse", "erofs", "materialized"):
        raise InvalidRequest(f"--lowers must be node, fuse, erofs or materialized, not {cfg.lowers!r}")
    manifest, tasks = load_corpus(cfg.corpus)
    task = tasks[0].model_dump()
    harness = manifest.component("harness-mini-swe-agent")
    groups = stack_groups([c.model_dump() for c in manifest.components])
    groups = type(groups)(groups.os, groups.repos, harness.group, groups.evaluator)
    stack = next(st for st in stacks_from_corpus(cfg.corpus)
                 if st.harness == harness.name and st.repo == f"repo-{task['repo']}")
    repo_comp = manifest.component(f"repo-{task['repo']}")
    cmds = commands(task, str(repo_comp.info.get("test_command") or task["test_command"]))
    if cfg.only:
        cmds = {k: v for k, v in cmds.items() if k in cfg.only}
    samples: list[dict[str, Any]] = []
    with work_lock(cfg.work), BenchRig(cfg.work, cfg.profile) as rig:
        comps = ["os", f"repo-{task['repo']}", harness.name, "evaluator"]
        publish_components(cfg.corpus, comps, rig.registry.url, f"bench-registry:{cfg.work}",
                           cfg.work / "publish-cache.json", cfg.work / "publish-scratch", cfg.log)
        seed_layer_cache(cfg.work / "images", SHARED_LAYER_CACHE)
        images = prepare_images([stack], rig.registry.address, cfg.work / "images")
        ctd = ContainerdRollouts(rig.ctr, images, {task["repo"]: stack}, cfg.corpus / "evaluator" / EVAL_DIR.lstrip("/"))
        ref = images[stack.name].bundled
        rig.ctr.clear()
        ctd._ensure_image(ref)
        node_cfg: dict[str, Any] = {"max_environments": 4 * cfg.concurrency + 4}
        if cfg.lowers in ("fuse", "erofs"):
            node_cfg["lowers"] = {"materialize_after": 0, "erofs": cfg.lowers == "erofs"}
        elif cfg.lowers == "materialized":
            node_cfg["lowers"] = {"materialize_after": 1}
        variants = {"rollstack": {}}
        if cfg.baseline:  # the same node without this pass's FUSE changes, side by side
            variants["rollstack-untuned"] = {"ROLLSTACK_FUSE_PRIORITY": "normal", "ROLLSTACK_XATTR_FAST": "0"}
        if cfg.nolinger:  # the same node with the fast path's wait for the next request off
            variants["rollstack-nolinger"] = {"ROLLSTACK_FUSE_LINGER_US": "0"}
        nodes: dict[str, Any] = {}
        plan = rollstack_plan(task, groups, 0)
        try:
            for vname, env_vars in variants.items():
                saved = {k: os.environ.get(k) for k in env_vars}
                os.environ.update(env_vars)  # read by the lazy store daemon the node starts
                try:
                    system = RollstackSystem("rollstack", rig.registry.url, cfg.work / f"node-exec-{vname}", rig.link,
                                             **node_cfg)
                    system.clear()
                finally:
                    for k, v in saved.items():
                        if v is None:
                            os.environ.pop(k, None)
                        else:
                            os.environ[k] = v
                nodes[vname] = system
            for system in nodes.values():  # after every clear (it drops the page cache): warm each node
                with system.node.create(plan) as env:  # like a first rollout
                    for c in cmds.values():
                        env.exec(c, timeout=600)
                if cfg.lowers in ("materialized", "erofs"):
                    system.settle(900)
            for rep in range(cfg.reps):
                load = os.getloadavg()[0]
                # docker-equivalent
                cids = [f"rsx-{os.getpid()}-{rep}-{i}" for i in range(cfg.concurrency)]

                def ctd_one(cid: str) -> dict[str, float]:
                    rig.ctr.create(ref, cid, ["sleep", "infinity"])
                    rig.ctr.run("tasks", "start", "-d", cid)
                    ctd._exec(cid, task["workdir"], "git apply -", task["patch"])
                    out = {}
                    for name, c in cmds.items():
                        t = time.perf_counter()
                        ctd._exec(cid, task["workdir"], c)
                        out[name] = time.perf_counter() - t
                    return out

                try:
                    with ThreadPoolExecutor(cfg.concurrency) as ex:
                        for r in ex.map(ctd_one, cids):
                            samples.append({"system": "docker-equivalent", "rep": rep, "commands": r, "load": load})
                finally:
                    for cid in cids:
                        rig.ctr.run("tasks", "kill", "-s", "SIGKILL", cid, check=False)
                        rig.ctr.delete(cid)
                order = list(nodes.items())
                for vname, system in (order if rep % 2 == 0 else order[::-1]):  # alternate which goes first
                    lazy = system.node.service.stages.lazy
                    _rollstack_rep(vname, system, lazy, plan, cmds, cfg, rep, load, samples)
                cfg.log(f"rep {rep} load {load:.1f}: " + "; ".join(
                    f"{smp['system']} " + " ".join(f"{n} {t:.2f}s" for n, t in smp["commands"].items())
                    + (f" (daemon {smp['daemon_cpu_s']:.2f} cpu-s, fuse lowers {smp['fuse_lowers']})" if "daemon_cpu_s" in smp else "")
                    for smp in samples if smp["rep"] == rep))
            mats = {v: s.node.service.stages.lowers.materializer for v, s in nodes.items()}
            mat_stats = {v: m.stats() for v, m in mats.items() if m is not None}
        finally:
            for system in nodes.values():
                system.stop()
    return {"summary": summarize(samples), "samples": samples, "commands": cmds, "materializer": mat_stats,
            "config": {"reps": cfg.reps, "concurrency": cfg.concurrency, "lowers": cfg.lowers, "corpus": str(cfg.corpus),
                       "variants": variants}}


def _rollstack_rep(vname: str, system: Any, lazy: Any, plan: dict[str, Any], cmds: dict[str, str], cfg: ExecConfig,
       rep: int, load: float, samples: list[dict[str, Any]]) -> None:
    from rollstack_bench.systems.rollstack import on_fuse_lowers

    dpid = lazy.process.pid
    envs = [system.node.create(plan) for _ in range(cfg.concurrency)]
    try:
        ops0, cpu0 = dict(lazy.stats().get("fuse_ops", {})), proc_cpu(dpid)
        mounts = Path("/proc/self/mountinfo").read_text()
        fuse_lowers = [on_fuse_lowers(e.id, mounts) for e in envs]

        def rs_one(env: Any) -> dict[str, float]:
            out = {}
            for name, c in cmds.items():
                t = time.perf_counter()
                env.exec(c, timeout=600)
                out[name] = time.perf_counter() - t
            return out

        with ThreadPoolExecutor(cfg.concurrency) as ex:
            results = list(ex.map(rs_one, envs))
        ops1, cpu1 = lazy.stats().get("fuse_ops", {}), proc_cpu(dpid)
        ops = {k: v - ops0.get(k, 0) for k, v in ops1.items() if v - ops0.get(k, 0)}
        for r, fl in zip(results, fuse_lowers):
            samples.append({"system": vname, "rep": rep, "commands": r, "load": load,
                            "fuse_lowers": fl, "daemon_cpu_s": cpu1 - cpu0,
                            "fuse_requests": sum(v for k, v in ops.items() if ":" not in k), "fuse_ops": ops})
    finally:
        for e in envs:
            e.destroy()



def register(app: typer.Typer) -> None:
    @app.command("exec")
    def bench_exec(
        reps: Annotated[int, typer.Option("--reps", min=1)] = 3,
        concurrency: Annotated[int, typer.Option("--concurrency", min=1)] = 1,
        lowers: Annotated[str, typer.Option("--lowers", help="node | fuse | erofs | materialized")] = "node",
        only: Annotated[str, typer.Option("--only", help="comma-separated command names")] = "",
        baseline: Annotated[bool, typer.Option("--untuned/--no-untuned",
                                               help="also a node with the FUSE fast path off and normal priority")] = True,
        nolinger: Annotated[bool, typer.Option("--nolinger", help="also a node with fuse_linger_us 0")] = False,
        corpus: Annotated[Path | None, typer.Option("--corpus")] = None,
        work: Annotated[Path, typer.Option("--work")] = Path("/var/cache/rollstack/bench-init"),
        profile: Annotated[str, typer.Option("--profile")] = "dc",
        as_json: Annotated[bool, typer.Option("--json")] = False,
    ) -> None:
        """The same commands in fresh rollstack environments and containerd containers, interleaved."""
        from rollstack_bench.init import default_corpus
        from rollstack_bench.report import _json_safe, machine_facts
        from rollstack.cli.output import emit

        cfg = ExecConfig(corpus=corpus or default_corpus(True), reps=reps, concurrency=concurrency, lowers=lowers,
                         profile=profile, work=work, only=[s for s in only.split(",") if s], baseline=baseline,
                         nolinger=nolinger)
        doc = run_exec(cfg)
        doc["machine"] = machine_facts()

        def human(d: dict[str, Any]) -> None:
            print(json.dumps(d["summary"], indent=1))

        emit(_json_safe(doc), as_json, human)
