"""`rollstack bench env`: the node agent's own costs, measured through its HTTP API.

Starts a real agent (`rollstack node start` in a temporary root, loopback port) over a tiny
busybox corpus it publishes to an OCI layout store, then measures, side by side in one run:
- warm create -> first exec: wall time from POST /v1/environments to the end of `exec true`
  (layers already in the node's caches), p50/p95 over `--n` environments;
- `exec true` through the HTTP API (one environment, `--execs` calls), p50/p95;
- `--concurrent` environments alive at once (created in parallel, one exec each), the agent's RSS
  and the lazy store daemon's RSS then;
- `--cycles` create/exec/destroy cycles, then what they left: mounts, env dirs, runc state,
  cgroups, processes.
Targets (issue 5): warm create->first exec p50 <= 0.3 s; exec true p50 <= 40 ms; 64 concurrent
environments with agent RSS <= 300 MiB; zero leftovers.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Annotated

import typer

from rollstack.host import mountinfo
from rollstack.host.cgroups import env_cgroup, env_cgroup_dirs

BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "ls", "cat", "echo", "true", "false", "mkdir", "rm", "sleep", "ps", "wc", "test",
           "env", "pwd", "ln", "head", "tail", "kill", "grep", "dd", "printf", "touch", "id", "ip",
           "yes", "tr")
HELLO_MUTATION = "--- a/hello.txt\n+++ b/hello.txt\n@@ -1 +1 @@\n-hello\n+bug\n"
CHECK_SH = """#!/bin/sh
# the evaluator's test: passes iff the task's bug is fixed
grep -q '^fixed$' /work/app/hello.txt && echo PASS && exit 0
echo FAIL; exit 1
"""


def _log(msg: str) -> None:
    print(f"[bench env] {msg}", file=sys.stderr, flush=True)


# -- the corpus (also used by the node's integration tests) -----------------------------------

def _files(root: Path, files: dict[str, str], mode: int = 0o644) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        p.chmod(mode)
    return root


def build_busybox_trees(work: Path) -> dict[str, Path]:
    """Source trees of three groups: os/busybox (static busybox + applets), repo/app, evaluator/app."""
    os_root = work / "os"
    (os_root / "bin").mkdir(parents=True)
    shutil.copy2(BUSYBOX, os_root / "bin" / "busybox")
    for applet in APPLETS:
        os.symlink("busybox", os_root / "bin" / applet)
    for d in ("tmp", "etc", "proc", "dev", "sys", "root", "work", "usr/bin"):
        (os_root / d).mkdir(parents=True, exist_ok=True)
    (os_root / "tmp").chmod(0o1777)
    (os_root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    repo = _files(work / "repo", {"work/app/hello.txt": "hello\n", "work/app/README": "a tiny repo\n"})
    ev = _files(work / "eval", {"eval/check.sh": CHECK_SH}, mode=0o755)
    return {"os": os_root, "repo": repo, "eval": ev}


def publish_busybox_corpus(store_dir: Path, work: Path) -> str:
    """Publish os/busybox:1, repo/app:1, evaluator/app:1 into an OCI layout; returns its spec."""
    from rollstack.plan.groups import publish_group
    from rollstack.store import open_store

    trees = build_busybox_trees(work)
    spec = f"oci:{store_dir}"
    store = open_store(spec)
    try:
        publish_group(store, "os/busybox:1", [trees["os"]], work_dir=work)
        publish_group(store, "repo/app:1", [trees["repo"]], work_dir=work)
        publish_group(store, "evaluator/app:1", [trees["eval"]], work_dir=work)
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()
    return spec


def busybox_plan(**overrides: Any) -> dict[str, Any]:
    """A plan over the busybox corpus: a mutation, an evaluator, small quotas."""
    doc: dict[str, Any] = {
        "name": "app-task",
        "groups": ["os/busybox:1", "repo/app:1"],
        "mutation_text": HELLO_MUTATION,
        "workdir": "/work/app",
        "env": {"TASK": "app"},
        "resources": {"cpu": 0.5, "memory": "128Mi", "max_cpu": 2, "max_memory": "512Mi"},
        "timeout": 600,
        "evaluator": {
            "groups": ["os/busybox:1", "repo/app:1", "evaluator/app:1"],
            "command": ["/bin/sh", "/eval/check.sh"],
        },
    }
    doc.update(overrides)
    return doc


# -- measurement -------------------------------------------------------------------------------

def _rss(pid: int | None) -> int:
    if not pid:
        return 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _daemon_pid(root: Path) -> int | None:
    from rollstack.node.recovery import daemon_pids

    pids = daemon_pids(root / "lazy" / "mnt")
    return pids[0] if pids else None


def _timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _leftovers(root: Path, ids: set[str]) -> dict[str, int]:
    envs_dir = root / "envs"
    mounts = len(mountinfo.mounts_under(envs_dir))
    env_dirs = sum(1 for _ in envs_dir.iterdir()) if envs_dir.is_dir() else 0
    runc = root / "runc"
    runc_state = sum(1 for p in runc.iterdir() if p.name in ids) if runc.is_dir() else 0
    cgroups = sum(len(env_cgroup_dirs(i)) for i in ids)
    procs = 0
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if any(env_cgroup(i) in (d / "cgroup").read_text() for i in ids):
                    procs += 1
            except OSError:
                pass
    return {"mounts": mounts, "env_dirs": env_dirs, "runc_state": runc_state, "cgroups": cgroups, "processes": procs}


def leak_check(root: Path, ids: set[str], count: int, seconds: float, settle_s: float = 0.0) -> dict[str, Any]:
    """The `cycles` record of a benchmark's create/.../destroy cycles: what the environments
    `ids` left under the node `root` (mounts, env dirs, runc state, cgroups, processes), looked
    at again for up to `settle_s` while anything is left (a background destroy still running)."""
    deadline = time.monotonic() + settle_s
    left = _leftovers(root, ids)
    while any(left.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _leftovers(root, ids)
    return {"count": count, "seconds": round(seconds, 3), "leftovers": left, "clean": not any(left.values())}


def cycles_line(cy: dict[str, Any], what: str) -> str:
    """The human line of a `leak_check` record; `what`: the cycle's steps ("create/exec/destroy")."""
    return (f"{cy['count']} {what} cycles in {cy['seconds']} s; leftovers {cy['leftovers']}"
            f" -> {'clean' if cy['clean'] else 'LEAKED'}")


def run_bench(n: int, execs: int, concurrent: int, cycles: int, keep: bool = False,
              warm: int = 0) -> dict[str, Any]:
    from rollstack_bench.report import current_command, machine_facts, summarize
    from rollstack.client import Client
    from rollstack.node import agent
    from rollstack.node.config import NodeConfig
    from rollstack.node.server import free_port

    base = Path(tempfile.mkdtemp(prefix="rollstack-bench-env-", dir="/var/tmp"))
    config = NodeConfig(root=base / "node", listen=f"127.0.0.1:{free_port()}",
                        store=None, max_environments=max(concurrent + 8, 16), warm_pool=warm)
    ids: set[str] = set()
    try:
        _log("publishing the busybox corpus")
        config = config.model_copy(update={"store": publish_busybox_corpus(base / "store", base / "build")})
        started = agent.start(config)
        pid = started["pid"]
        plan = busybox_plan()
        with Client(config.url(), token=config.token_path.read_text().strip()) as client:
            _log("warming the caches")
            with client.create(plan) as env:
                ids.add(env.id)
                env.exec(["true"])
            _log(f"warm create -> first exec x{n}")
            first_exec, creates = [], []
            for _ in range(n):
                t = time.perf_counter()
                env = client.create(plan)
                creates.append(time.perf_counter() - t)
                env.exec(["true"])
                first_exec.append(time.perf_counter() - t)
                ids.add(env.id)
                env.destroy()
            _log(f"exec true x{execs}")
            with client.create(plan) as env:
                ids.add(env.id)
                env.exec(["true"])
                exec_true = [_timed(lambda: env.exec(["true"])) for _ in range(execs)]
            rss_idle = _rss(pid)
            _log(f"{concurrent} concurrent environments")
            # Small start quotas so that 64 fit the node's admission on 2 cores (CPU quotas may
            # overcommit cores x4; each environment still grows on demand).
            small = busybox_plan(resources={"cpu": 0.1, "memory": "64Mi", "max_cpu": 1, "max_memory": "256Mi"})
            conc = _concurrent(client, small, concurrent, ids, pid, config.root)
            _log(f"{cycles} create/exec/destroy cycles")
            t = time.perf_counter()
            for i in range(cycles):
                env = client.create(plan)
                ids.add(env.id)
                env.exec("echo x > /tmp/f; sleep 60 & true")
                env.destroy()
            cycle_s = time.perf_counter() - t
            from rollstack_bench.node_common import wait_destroys_drained

            wait_destroys_drained(client)  # destroys finish in the background (docs/node.md)
            warm_hits = next((float(x.split()[1]) for x in client._service.metrics_text().splitlines()
                              if x.startswith("rollstack_warm_hits_total ")), 0.0)
            cycles_doc = leak_check(config.root, ids, cycles, cycle_s) if not warm else {}
        if warm:  # ready warm sandboxes are containers until the agent stops: look after it
            agent.stop(config)
            cycles_doc = leak_check(config.root, ids, cycles, cycle_s)
        return {
            "warm_create_to_first_exec": summarize(first_exec),
            "warm_create": summarize(creates),
            "exec_true_http": summarize(exec_true),
            "concurrent": conc,
            "agent_rss_idle_bytes": rss_idle,
            "cycles": {**cycles_doc, "warm_pool": warm, "warm_hits": int(warm_hits)},
            "targets": {
                "warm_create_to_first_exec_p50_s": 0.3, "exec_true_p50_s": 0.040,
                "concurrent_envs": 64, "agent_rss_bytes": 300 << 20,
            },
            "machine": machine_facts(),
            "command": current_command(),
        }
    finally:
        try:
            agent.stop(config)
        finally:
            if not keep:
                shutil.rmtree(base, ignore_errors=True)


def _concurrent(client: Any, plan: dict[str, Any], count: int, ids: set[str], pid: int, root: Path) -> dict[str, Any]:
    envs: list[Any] = []
    t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=8) as pool:
        envs = list(pool.map(lambda _: client.create(plan), range(count)))
    create_s = time.perf_counter() - t
    ids.update(e.id for e in envs)
    try:
        t = time.perf_counter()
        with ThreadPoolExecutor(max_workers=count) as pool:
            codes = list(pool.map(lambda e: e.exec("sleep 1; echo ok").exit_code, envs))
        exec_s = time.perf_counter() - t
        rss = _rss(pid)
        daemon_rss = _rss(_daemon_pid(root))
    finally:
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda e: e.destroy(), envs))
    return {
        "environments": count,
        "create_all_seconds": round(create_s, 3),
        "parallel_exec_seconds": round(exec_s, 3),
        "exec_ok": sum(1 for c in codes if c == 0),
        "agent_rss_bytes": rss,
        "lazy_daemon_rss_bytes": daemon_rss,
    }


def _human(doc: dict[str, Any]) -> None:
    m = doc["machine"]
    print(f"machine: {m.get('cpu')}, {m.get('cores')} cores, {m.get('memory_bytes', 0) / 2**30:.0f} GiB, "
          f"kernel {m.get('kernel')}, cgroup {m.get('cgroup')}; command: {doc['command']}")
    fe, ex, c = doc["warm_create_to_first_exec"], doc["exec_true_http"], doc["concurrent"]
    print(f"warm create -> first exec  p50 {fe['p50'] * 1000:.0f} ms  p95 {fe['p95'] * 1000:.0f} ms  (target <= 300 ms)")
    print(f"exec true over HTTP        p50 {ex['p50'] * 1000:.1f} ms  p95 {ex['p95'] * 1000:.1f} ms  (target <= 40 ms)")
    print(f"{c['environments']} concurrent envs: created in {c['create_all_seconds']} s, "
          f"{c['exec_ok']} execs ok, agent RSS {c['agent_rss_bytes'] / 2**20:.0f} MiB (target <= 300), "
          f"lazy daemon RSS {c['lazy_daemon_rss_bytes'] / 2**20:.0f} MiB")
    print(cycles_line(doc["cycles"], "create/exec/destroy"))


def register(app: typer.Typer) -> None:
    @app.command("env")
    def bench_env(
        as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
        n: Annotated[int, typer.Option("--n", help="warm create->first exec samples")] = 30,
        execs: Annotated[int, typer.Option("--execs", help="`exec true` samples")] = 200,
        concurrent: Annotated[int, typer.Option("--concurrent", help="environments alive at once")] = 64,
        cycles: Annotated[int, typer.Option("--cycles", help="create/exec/destroy cycles for the leak check")] = 100,
        keep: Annotated[bool, typer.Option("--keep", help="keep the temporary root")] = False,
        warm: Annotated[int, typer.Option("--warm", help="the node's warm pool per stack (0: off)")] = 0,
    ) -> None:
        """Node agent costs: warm create->first exec, exec latency, concurrency + RSS, leaks."""
        from rollstack.cli.output import emit

        emit(run_bench(n, execs, concurrent, cycles, keep, warm), as_json, _human)
