"""`rollstack bench isolation`: what each isolation tier costs, measured side by side in one run.

- network: create time with `network: none` vs an allow policy (the netns + veth + nftables
  build runs on a thread while the overlay mounts; `network_wait` is what it adds after them),
  then create/destroy cycles checked for leaked interfaces, namespaces, tables, addresses;
- throughput: a 100 MB download from a netns of ours (busybox httpd) through the allow policy,
  against the same download from the host over the same kind of veth link (the "link");
- tiers: create, `exec true`, `python3 -c "import ..."`, a syscall-heavy loop (dd bs=1) and a
  fork-heavy loop, under runc, runc with a user namespace, and runsc (ptrace platform), on the corpus OS tree when it
  is built (`/var/cache/rollstack/corpus/small/os`, Debian with python3), else busybox.

Needs root (netns, nftables, overlayfs, runc, runsc). Everything it makes is removed.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import typer

CORPUS_OS = Path("/var/cache/rollstack/corpus/small/os")
IMPORTS = "import json, email.parser, http.client, asyncio, decimal, argparse, logging, subprocess"
SYSCALLS = "dd if=/dev/zero of=/dev/null bs=1 count=200000 2>/dev/null"
DOWNLOADS = 10
FORKS = "i=0; while [ $i -lt 200 ]; do /bin/true; i=$((i+1)); done"


def busybox_tree(dest: Path) -> Path:
    for d in ("bin", "etc", "root", "tmp", "work"):
        (dest / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2("/bin/busybox", dest / "bin" / "busybox")
    applets = subprocess.run(["/bin/busybox", "--list"], capture_output=True, text=True, check=True).stdout.split()
    for a in applets:
        if a != "busybox" and not (dest / "bin" / a).exists():
            os.symlink("busybox", dest / "bin" / a)
    (dest / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    os.chmod(dest / "tmp", 0o1777)
    return dest


def _stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"median": round(statistics.median(xs), 6), "p95": round(xs[min(len(xs) - 1, int(0.95 * len(xs)))], 6),
            "min": round(xs[0], 6), "n": len(xs)}


def _wait_warm(mgr: Any, size: int, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while len(mgr._warm) < size and time.monotonic() < end:
        time.sleep(0.01)


def bench_network(rt: Any, warm_rt: Any, warm: int, lower: Path, work: Path, creates: int,
                  cycles: int) -> dict[str, Any]:
    from rollstack_bench.netlab import Upstream
    from rollstack.plan.network import parse_allow
    from rollstack.run.network import leftovers, resolve_spec
    from rollstack.run.ocispec import SpecParams

    www = work / "www"
    www.mkdir()
    with open(www / "blob", "wb") as f:
        f.write(os.urandom(1 << 20) * 100)  # 100 MiB (incompressible 1 MiB, repeated)
    up = Upstream(www)
    out: dict[str, Any] = {}
    try:
        up.serve(8000)
        allow = resolve_spec("allow", [parse_allow(f"{up.addr}:8000")], [])
        # the first three without a user namespace (what the warm pool serves), the last two with
        # one (the default since user namespaces are on: no warm slot, the veth moves in after start)
        modes = ("none", "allow_cold", "allow_warm", "none_userns", "allow_userns")
        series: dict[str, dict[str, list[float]]] = {m: {"create": [], "network": [], "network_wait": []}
                                                     for m in modes}
        for i in range(creates):
            for mode in modes:  # interleaved: the same noise for all
                env_id = f"bi-{mode.replace('_', '-')}-{uuid.uuid4().hex[:8]}"
                r = warm_rt if mode == "allow_warm" else rt
                if mode == "allow_warm":
                    _wait_warm(warm_rt.network, warm)  # steady state: the pool has refilled
                t = time.perf_counter()
                env = r.create(env_id, [lower], SpecParams(env_id), userns=mode.endswith("_userns"),
                               network=None if mode.startswith("none") else allow)
                series[mode]["create"].append(time.perf_counter() - t)
                series[mode]["network"].append(env.timings.get("network", 0.0))
                series[mode]["network_wait"].append(env.timings.get("network_wait", 0.0))
                env.destroy()
        out["create"] = {m: {k: _stats(v) for k, v in s.items()} for m, s in series.items()}
        for m in ("allow_cold", "allow_warm", "allow_userns"):
            base = "none_userns" if m == "allow_userns" else "none"
            out["create"][f"added_median_s_{m}"] = round(out["create"][m]["create"]["median"]
                                                         - out["create"][base]["create"]["median"], 6)
        out["create"]["warm_pool"] = warm
        slots: set[int] = set()
        t = time.perf_counter()
        for i in range(cycles):
            env_id = f"bc-{i}-{uuid.uuid4().hex[:6]}"
            env = rt.create(env_id, [lower], SpecParams(env_id), network=allow)
            slots.add(env.net.slot)
            env.destroy()
        left = leftovers(sorted(slots))
        out["cycles"] = {"count": cycles, "seconds": round(time.perf_counter() - t, 3),
                         "slots_used": len(slots), "leftovers": left,
                         "leaked": sum(len(v) for v in left.values())
                         + len(rt.network.owned(f"{rt.root}:"))}
        # throughput: through the policy vs host -> upstream over the same kind of veth
        env_id = f"bt-{uuid.uuid4().hex[:8]}"
        env = rt.create(env_id, [lower], SpecParams(env_id), network=allow)
        try:
            through, link = [], []
            loop = (f"i=0; while [ $i -lt {DOWNLOADS} ]; do wget -q -O /dev/null "
                    f"http://{up.addr}:8000/blob || exit 9; i=$((i+1)); done")
            overhead = statistics.median(env.exec(["/bin/true"]).duration for _ in range(5))
            for _ in range(3):  # interleaved; the same busybox wget loop both ways
                r = env.exec(loop, timeout=300)
                if r.exit_code != 0:
                    raise RuntimeError(f"download through the policy failed: {r.stderr!r}")
                through.append(r.duration - overhead)
                t = time.perf_counter()
                subprocess.run(["busybox", "sh", "-c", loop], check=True, timeout=300)
                link.append(time.perf_counter() - t)
            size = (www / "blob").stat().st_size * DOWNLOADS
            mbps = lambda s: round(size / s / 1e6, 1)  # noqa: E731
            out["throughput"] = {"bytes": size, "through_policy_MBps": mbps(min(through)),
                                 "link_MBps": mbps(min(link)),
                                 "ratio": round(min(link) / min(through), 3),
                                 "exec_overhead_subtracted_s": round(overhead, 4),
                                 "median_through_MBps": mbps(statistics.median(through)),
                                 "median_link_MBps": mbps(statistics.median(link)),
                                 "runs": 3, "note": f"{DOWNLOADS} x 100 MiB per run, best of 3 each (interleaved); the env figure "
                                 "has one `exec true` median subtracted; "
                                 "link = the host's own veth to the same netns (no policy, no NAT, one hop less)"}
        finally:
            env.destroy()
    finally:
        up.close()
    return out


def bench_gvisor(rt: Any, lower: Path, reps: int) -> dict[str, Any]:
    from rollstack.run.ocispec import SpecParams

    has_python = (lower / "usr" / "bin" / "python3").exists()
    out: dict[str, Any] = {"tree": str(lower), "platform": "ptrace"}
    for engine in ("runc", "runc+userns", "runsc"):
        res: dict[str, list[float]] = {"create": [], "exec_true": [], "python_import": [],
                                       "syscalls_dd_bs1_200k": [], "forks_200": []}
        for _ in range(max(1, reps // 3)):
            env_id = f"bg-{engine.replace('+', '-')}-{uuid.uuid4().hex[:8]}"
            t = time.perf_counter()
            env = rt.create(env_id, [lower], SpecParams(env_id, memory=1 << 30),
                            runtime="runsc" if engine == "runsc" else "runc", userns=engine == "runc+userns")
            res["create"].append(time.perf_counter() - t)
            try:
                for _ in range(reps):
                    res["exec_true"].append(env.exec(["/bin/true"]).duration)
                for _ in range(3):
                    if has_python:
                        r = env.exec(["python3", "-c", IMPORTS], timeout=120)
                        if r.exit_code != 0:
                            raise RuntimeError(f"{engine}: python3 failed: {r.stderr!r}")
                        res["python_import"].append(r.duration)
                    res["syscalls_dd_bs1_200k"].append(env.exec(SYSCALLS, timeout=300).duration)
                    res["forks_200"].append(env.exec(FORKS, timeout=300).duration)
            finally:
                env.destroy()
        out[engine] = {k: _stats(v) for k, v in res.items() if v}
    out["slowdown"] = {k: round(out["runsc"][k]["median"] / out["runc"][k]["median"], 2)
                       for k in out["runc"] if k in out["runsc"]}
    out["userns_ratio"] = {k: round(out["runc+userns"][k]["median"] / out["runc"][k]["median"], 2)
                           for k in out["runc"] if k in out["runc+userns"]}
    return out


WALK = ["sh", "-c", "find / -xdev -printf '%u\\n' | sort | uniq -c | sort -rn | head -3"]  # owners seen inside


SUITE = "python3 -m pytest -q -p no:cacheprovider -x tests/test_more.py 2>&1 | tail -1"
WALK_FILES = ["sh", "-c", "find / -xdev -type f | wc -l"]


def bench_corpus_tiers(store: str, work: Path, reps: int) -> dict[str, Any]:
    """The tiers on a real corpus environment through a local node over the lazy store (user
    namespaces: layers through the shifted view or idmapped materialized layers).

    Two parts, each interleaved across the tiers so they share the noise: `creates` x (create,
    destroy) per tier (client-side wall time; the first round is dropped: cold caches), then one
    live environment per tier running, `reps` times each, a walk of the whole rootfs (`find`:
    a lookup + stat of every file), python imports and the repository's own test file (the
    task's bug not applied: everything passes)."""
    from rollstack.client.local import Node
    from rollstack_corpus.cache import ensure_corpus
    from rollstack.tasks.plans import rollout_plan, stack_groups

    corpus = ensure_corpus(None, False, lambda m: None)
    groups = stack_groups(corpus.manifest["components"], harness="mini-swe-agent")
    plan = rollout_plan(corpus.tasks[0], groups, 0)
    plan.pop("mutation_text", None)
    tiers = {"runc": ("runc", False), "runc+userns": ("runc", True), "runsc": ("runsc", False)}
    res: dict[str, dict[str, list[float]]] = {k: {"create": [], "walk": [], "python_import": [], "suite": []}
                                              for k in tiers}
    seen: dict[str, dict[str, str]] = {}

    def plan_of(kind: str) -> dict[str, Any]:
        runtime, userns = tiers[kind]
        return {**plan, "runtime": runtime, "security": {"userns": userns}}

    with Node(store=store, root=work / "lazy-node") as node:
        for i in range(2 * reps + 1):
            for kind in tiers:
                t = time.perf_counter()
                env = node.create(plan_of(kind))
                created = time.perf_counter() - t
                env.destroy()
                if i:
                    res[kind]["create"].append(created)
        envs = {kind: node.create(plan_of(kind)) for kind in tiers}
        try:
            for _ in range(reps):
                for kind, env in envs.items():
                    for name, argv, limit in (("walk", WALK_FILES, 300), ("python_import", ["python3", "-c", IMPORTS], 120),
                                              ("suite", ["sh", "-c", SUITE], 600)):
                        r = env.exec(argv, timeout=limit)
                        if r.exit_code or (name == "suite" and " passed" not in r.stdout):
                            raise RuntimeError(f"{kind} {name}: {r.stdout[-300:]!r} {r.stderr[-300:]!r}")
                        res[kind][name].append(r.duration)
                        if name != "python_import":
                            seen.setdefault(kind, {})[name] = r.stdout.strip()
                    if "uid_map" not in seen[kind]:
                        seen[kind]["uid_map"] = " ".join(env.exec("cat /proc/self/uid_map").stdout.split())
                        seen[kind]["owners"] = env.exec(WALK, timeout=300).stdout.split("\n")[0].strip()
        finally:
            for env in envs.values():
                env.destroy()
    out: dict[str, Any] = {"store": store, "task": corpus.tasks[0].instance_id, "suite": SUITE,
                           "walk": " ".join(WALK_FILES), "seen": seen}
    out.update({k: {m: _stats(v) for m, v in s.items()} for k, s in res.items()})
    out["userns_ratio"] = {m: round(out["runc+userns"][m]["median"] / out["runc"][m]["median"], 2)
                           for m in res["runc"]}
    out["runsc_ratio"] = {m: round(out["runsc"][m]["median"] / out["runc"][m]["median"], 2) for m in res["runc"]}
    return out


def run(work: Path, creates: int, cycles: int, reps: int, command: str, gvisor: bool = True,
        lazy_store: str | None = None, network: bool = True) -> dict[str, Any]:
    from rollstack.run.environment import EnvironmentRuntime, RuntimeConfig

    os.chmod(work, 0o755)  # the user-namespace tier's mapped root must reach the env roots
    lower = busybox_tree(work / "busybox")
    rt = EnvironmentRuntime(RuntimeConfig(root=work / "rt"))
    warm = 2
    warm_rt = EnvironmentRuntime(RuntimeConfig(root=work / "rt-warm", network_warm=warm, subreaper=False))
    warm_rt.start_network_pool(lazy=False)
    try:
        doc: dict[str, Any] = {"command": command, "cores": os.cpu_count(), "kernel": os.uname().release,
                               "loadavg_start": [round(x, 1) for x in os.getloadavg()]}
        if network:
            doc["network"] = bench_network(rt, warm_rt, warm, lower, work, creates, cycles)
        if lazy_store:
            doc["corpus_tiers"] = bench_corpus_tiers(lazy_store, work, reps)
        if gvisor:
            doc["gvisor"] = bench_gvisor(rt, CORPUS_OS if (CORPUS_OS / "usr/bin/python3").exists() else lower, reps)
        doc["loadavg_end"] = [round(x, 1) for x in os.getloadavg()]
        return doc
    finally:
        warm_rt.close()
        warm_rt.cleanup_leftovers()
        rt.cleanup_leftovers()


def _human(doc: dict[str, Any]) -> None:
    if "corpus_tiers" in doc:
        u = doc["corpus_tiers"]
        for k in u["userns_ratio"]:
            print(f"corpus {k:>14}: runc {u['runc'][k]['median'] * 1e3:8.1f} ms  runc+userns "
                  f"{u['runc+userns'][k]['median'] * 1e3:8.1f} ms (x{u['userns_ratio'][k]})  runsc "
                  f"{u['runsc'][k]['median'] * 1e3:8.1f} ms (x{u['runsc_ratio'][k]})")
    if "network" not in doc:
        return
    n = doc["network"]
    c = n["create"]
    print(f"create (median of {c['none']['create']['n']}): none {c['none']['create']['median'] * 1e3:.1f} ms")
    for m in ("allow_cold", "allow_warm"):
        print(f"  {m}: {c[m]['create']['median'] * 1e3:.1f} ms (+{c[f'added_median_s_{m}'] * 1e3:.1f} ms); "
              f"network setup itself {c[m]['network']['median'] * 1e3:.1f} ms, waited for "
              f"{c[m]['network_wait']['median'] * 1e3:.1f} ms after the mount")
    cy = n["cycles"]
    print(f"{cy['count']} create/destroy cycles with a policy: {cy['leaked']} leaked objects")
    t = n["throughput"]
    print(f"100 MB download: {t['through_policy_MBps']} MB/s through the policy, {t['link_MBps']} MB/s "
          f"on the link ({t['ratio']:.0%})")
    if "gvisor" in doc:
        g = doc["gvisor"]
        for k, v in g["slowdown"].items():
            print(f"{k:>22}: runc {g['runc'][k]['median'] * 1e3:8.1f} ms  runc+userns "
                  f"{g['runc+userns'][k]['median'] * 1e3:8.1f} ms  runsc {g['runsc'][k]['median'] * 1e3:8.1f} ms  x{v}")


def register(app: typer.Typer) -> None:
    @app.command("isolation")
    def isolation_bench(
        creates: int = typer.Option(20, "--creates", help="creates per network mode (interleaved)"),
        cycles: int = typer.Option(200, "--cycles", help="create/destroy cycles for the leak check"),
        reps: int = typer.Option(9, "--reps", help="exec repetitions per engine"),
        no_gvisor: bool = typer.Option(False, "--no-gvisor", help="skip the runc/runsc comparison"),
        lazy_store: Optional[str] = typer.Option(None, "--lazy-store", help="a store holding the small "
                                                 "corpus: also measure the tiers on it through the lazy store"),
        no_network: bool = typer.Option(False, "--no-network", help="skip the network measurements"),
        out: Optional[Path] = typer.Option(None, "--out", help="also write the JSON here"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
    ) -> None:
        """Cost of network policy (create time, throughput, leaks) and of the gVisor tier."""
        command = " ".join(["rollstack", *sys.argv[1:]]) if sys.argv[1:2] == ["bench"] else "rollstack bench isolation"
        # under /var/tmp: the user-namespace tier needs every parent searchable (not /tmp/pytest-*)
        with tempfile.TemporaryDirectory(prefix="rollstack-bench-isolation-", dir="/var/tmp") as tmp:
            doc = run(Path(tmp), creates, cycles, reps, command, gvisor=not no_gvisor, lazy_store=lazy_store,
                      network=not no_network)
        if out is not None:
            out.write_text(json.dumps(doc, indent=2))
        if as_json:
            print(json.dumps(doc, indent=2))
        else:
            _human(doc)
