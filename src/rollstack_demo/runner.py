"""`run_demo(config) -> dict`: corpus -> publish -> in-process node -> rollouts -> report document.

The node (`rollstack.Node`: NodeService, lazy store daemon, provisioner) lives only inside
`run_demo`: it is stopped in a `finally`, which destroys every environment it still owns, and a
leftover check then looks for anything that escaped (mounts or state under the node root,
runc containers, cgroups of the environments, child processes). Ctrl-C (or SIGTERM) stops new
steps, lets the steps in flight finish (their commands have timeouts), destroys everything, then
re-raises KeyboardInterrupt. The node is never stopped under a running create: tearing down an
environment that is still being built could race with its mounts.
"""

from __future__ import annotations

import os
import re
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from rollstack_demo.agent import run_rollout
from rollstack_demo.config import DemoConfig
from rollstack_corpus.cache import ensure_corpus
from rollstack.tasks.plans import stack_groups
from rollstack_corpus.publish import publish_corpus_groups
from rollstack_demo.report import RolloutRecord, summarize
from rollstack.errors import InvalidRequest
from rollstack.host import mountinfo
from rollstack.host.cgroups import env_cgroup_dirs
from rollstack.interrupts import sigterm_as_interrupt


def run_demo(config: DemoConfig) -> dict[str, Any]:
    """Run the demo; returns its JSON document (see docs/demo.md). Raises RollstackError on setup failure."""
    if os.geteuid() != 0:
        raise InvalidRequest("the demo needs root (debootstrap, FUSE, overlayfs, runc, cgroups)")
    with sigterm_as_interrupt():  # SIGTERM unwinds like Ctrl-C: every `finally` below runs
        return _run_demo(config)


def _run_demo(config: DemoConfig) -> dict[str, Any]:
    log = config.log
    t_all = time.monotonic()
    stages: dict[str, float] = {}
    load_start = os.getloadavg()

    corpus = ensure_corpus(config.corpus_dir, config.build_corpus, log)
    stages["corpus"] = corpus.seconds
    tasks = corpus.tasks[: config.tasks]
    if len(tasks) < config.tasks:
        log(f"the corpus has {len(tasks)} tasks; running those")
    groups = stack_groups(corpus.manifest["components"])

    from rollstack.store import default_store_spec, open_store

    store_spec = config.store or default_store_spec()
    t = time.monotonic()
    store = open_store(store_spec)
    try:
        published = publish_corpus_groups(corpus, store, store_spec, config.publish_cache, config.scratch, log)
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()
    stages["publish"] = time.monotonic() - t

    records, node_doc, leftovers = _run_rollouts(config, store_spec, tasks, groups, stages)
    stages["total"] = time.monotonic() - t_all
    stages = {k: round(v, 3) for k, v in stages.items()}
    records.sort(key=lambda r: (r.task, r.rollout))
    summary = summarize(records, stages.get("rollouts", 0.0))
    return {
        "store": store_spec,
        "root": str(config.root),
        "corpus": {
            "path": str(corpus.root), "flavor": corpus.manifest.get("flavor"),
            "tasks": len(corpus.tasks), "build_seconds_recorded": corpus.manifest.get("build_seconds"),
        },
        "groups": [p.to_dict() for p in published],
        "rollout_stack": _rollout_stack(published),
        "config": {"tasks": len(tasks), "rollouts": config.rollouts,
                   "concurrency": min(config.concurrency, len(tasks) * config.rollouts),
                   "background_fill": config.background_fill},
        "node": node_doc,
        "rollouts": [r.to_dict() for r in records],
        "summary": summary,
        "stages": stages,
        "leftovers": leftovers,
        "machine": {"cpus": os.cpu_count(), "loadavg_start": [round(x, 2) for x in load_start],
                    "loadavg_end": [round(x, 2) for x in os.getloadavg()]},
        "ok": summary["errors"] == 0 and not any(leftovers.values()),
    }


def _rollout_stack(published: list[Any]) -> dict[str, Any]:
    """What one rollout environment stacks (os + first repository + harness): files vs layer bytes."""
    picked: dict[str, Any] = {}
    for p in published:
        kind = p.group.split("/", 1)[0]
        if kind in ("os", "repo", "harness") and kind not in picked:
            picked[kind] = p
    return {"groups": [p.group for p in picked.values()],
            "files_bytes": sum(p.tree_bytes for p in picked.values()),
            "layer_bytes": sum(p.size for p in picked.values())}


def _run_rollouts(config: DemoConfig, store_spec: str, tasks: list[dict[str, Any]], groups: Any,
                  stages: dict[str, float]) -> tuple[list[RolloutRecord], dict[str, Any], dict[str, list[str]]]:
    from rollstack.client.local import Node

    log = config.log
    node_root = config.node_root.absolute()
    node_root.mkdir(parents=True, exist_ok=True)
    records: list[RolloutRecord] = []
    seen_ids: set[str] = set()
    node_doc: dict[str, Any] = {"root": str(node_root)}
    cancel = threading.Event()
    children_before = set(child_processes())  # e.g. a test session's registry: not ours to account for
    t = time.monotonic()
    node = Node(store=store_spec, root=node_root)
    try:
        stages["node_start"] = time.monotonic() - t
        jobs = [(task, r) for r in range(config.rollouts) for task in tasks]
        workers = min(config.concurrency, len(jobs))
        log(f"node up at {node_root} ({stages['node_start']:.1f} s); "
            f"{len(tasks)} tasks x {config.rollouts} rollouts, {workers} at a time")
        t = time.monotonic()
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rollout") as pool:
            futures = [pool.submit(run_rollout, node, task, groups, r, exec_timeout=config.exec_timeout,
                                   cancel=cancel, background_fill=config.background_fill) for task, r in jobs]
            try:
                _collect(futures, records, cancel, log)
            except BaseException:
                cancel.set()  # the pool's exit waits for the workers: make them stop early
                raise
        stages["rollouts"] = time.monotonic() - t
        seen_ids.update(r.env_id for r in records if r.env_id)
        seen_ids.update(_destroyed_ids(node))
        node_doc["metrics"] = _node_metrics(node)
    finally:
        t = time.monotonic()
        node.close()
        stages["node_stop"] = time.monotonic() - t
    leftovers = find_leftovers(node_root, seen_ids, ignore_children=children_before)
    if any(leftovers.values()):
        log(f"LEFTOVERS after stop: {leftovers}")
    if cancel.is_set():
        raise KeyboardInterrupt
    return records, node_doc, leftovers


def _collect(futures: list[Future], records: list[RolloutRecord], cancel: threading.Event, log: Any) -> None:
    pending = set(futures)
    interrupted = 0
    while pending:
        try:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
        except KeyboardInterrupt:
            interrupted += 1
            cancel.set()
            for f in pending:
                f.cancel()
            if interrupted > 1:
                log("interrupted again: stopping as soon as the commands in flight return")
                return
            log("interrupted: no new steps; destroying everything once the steps in flight return")
            continue
        for f in done:
            if f.cancelled():
                continue
            rec = f.result()  # run_rollout records its own failures; anything else is a bug: raise
            records.append(rec)
            status = rec.error or f"reward {rec.reward}"
            log(f"[{len(records)}/{len(futures)}] {rec.task} #{rec.rollout}: init "
                f"{rec.timings.get('total', 0):.2f} s, {status}")


def _destroyed_ids(node: Any) -> set[str]:
    # The evaluator environments' ids are internal to the service; its tombstones name them.
    gone = getattr(node.service, "_gone", None)
    return set(gone) if isinstance(gone, dict) else set()


def _node_metrics(node: Any) -> dict[str, Any]:
    try:
        m = node.service.metrics()
    except Exception:  # noqa: BLE001 - metrics are informative only
        return {}
    keep = ("created_total", "destroyed_total", "create_failures_total", "execs_total", "evaluations_total",
            "agent_rss_bytes", "lazy_fetch_transferred_bytes_registry", "lazy_fetch_requests_registry",
            "lazy_disk_cache_bytes", "lazy_fetch_stall_seconds")
    return {k: m[k] for k in keep if k in m}


def find_leftovers(node_root: Path, env_ids: set[str], ignore_children: set[str] = frozenset()) -> dict[str, list[str]]:
    """What a stopped node left: mounts under its root, env dirs, runc state, env cgroups, children
    (live child processes of this process, `"<pid> <comm>"`, except `ignore_children` and the
    processes of another node's environments: another node in this process, a test session's,
    has its containers' processes reparented here too, each rooted in an `envs/ID/rootfs` of
    its own root; a process of this node's whose root was detached shows no such path and
    counts)."""
    mounts = mountinfo.mounts_under(node_root)
    envs_dir = node_root / "envs"
    envs = sorted(p.name for p in envs_dir.iterdir()) if envs_dir.is_dir() else []
    runc_dir = node_root / "runc"
    runc = sorted(p.name for p in runc_dir.iterdir() if p.is_dir()) if runc_dir.is_dir() else []
    cgroups = sorted(str(cg) for i in env_ids for cg in env_cgroup_dirs(i))
    processes = [c for c in child_processes()
                 if c not in ignore_children and not _other_nodes(int(c.split()[0]), node_root)]
    return {"mounts": mounts, "envs": envs, "runc": runc, "cgroups": cgroups, "processes": processes}


def _other_nodes(pid: int, node_root: Path) -> bool:
    """Whether process `pid` runs in an environment of another node than the one at `node_root`:
    its root is an `.../envs/ID/rootfs` outside `node_root` (see `find_leftovers`)."""
    try:
        root = os.readlink(f"/proc/{pid}/root")
    except OSError:
        return False
    mine = os.path.realpath(node_root) + "/"
    return re.fullmatch(r"/.+/envs/[^/]+/rootfs", root) is not None and not root.startswith(mine)


def child_processes() -> list[str]:
    """Live (non-zombie) child processes of this process."""
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # comm may hold spaces and parentheses: the fields after the last ')' are fixed.
        comm = stat[stat.find("(") + 1: stat.rfind(")")]
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and fields[1] == str(me) and fields[0] != "Z":
            out.append(f"{entry} {comm}")
    return out


