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
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator

import typer

from rollstack.bench import report

DEFAULT_CORPUS = Path(os.environ.get("ROLLSTACK_CORPUS_CACHE", "/var/cache/rollstack/corpus")) / "small"
DEFAULT_WORK = Path("/var/cache/rollstack/bench-fetch")
STACK = ("os", "repo-more-itertools", "harness-mini-swe-agent")  # bottom first
WORKDIR = "/work/more-itertools"
COMMAND = 'python3 -c "import more_itertools, pytest"'
CGROUP = Path("/sys/fs/cgroup/pids/rollstack")
BG_MODES = ("off", "gated", "ungated")
CHROOT = shutil.which("chroot", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") or "/usr/sbin/chroot"


def _log(msg: str) -> None:
    print(f"[bench fetch] {msg}", file=sys.stderr, flush=True)


def drop_page_cache(keep: Path | None = None) -> None:
    """Drop the page cache (the node forgets everything it read), then re-read `keep`: the
    registry's storage, which in a real deployment sits on another machine whose cache we do
    not drop (otherwise every range GET would also pay a local disk seek)."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3")
    if keep is not None and keep.exists():
        for f in keep.rglob("data"):
            if f.is_file():
                with open(f, "rb") as fh:
                    while fh.read(8 << 20):
                        pass


# -- stack preparation -------------------------------------------------------------------------
def ensure_blob(src: Path, out_dir: Path, name: str) -> tuple[str, Path]:
    """Convert `src` once (cached by name + source mtime)."""
    from rollstack.format import convert

    out_dir.mkdir(parents=True, exist_ok=True)
    blob, stamp = out_dir / f"{name}.blob", out_dir / f"{name}.stamp"
    built = src.parent / ".stamps" / src.name  # the corpus builder's stamp: written once a component is complete
    if built.exists():
        key = f"{src}:{built.read_text().strip()}:{built.stat().st_mtime_ns}"
    elif (src.parent / ".stamps").is_dir():
        raise RuntimeError(f"{src} is being (re)built by the corpus builder; try again when it is done")
    else:
        key = f"{src}:{src.stat().st_mtime_ns}"
    if blob.exists() and stamp.exists() and stamp.read_text().split("\n")[0] == key:
        return stamp.read_text().split("\n")[1], blob
    t0 = time.perf_counter()
    info = convert(src, blob)
    stamp.write_text(f"{key}\n{info.digest}\n")
    _log(f"converted {name}: {info.size >> 20} MiB, {info.entries} entries in {time.perf_counter() - t0:.1f}s")
    return info.digest, blob


def big_file_layer(out_dir: Path, mib: int) -> tuple[str, Path]:
    """A layer holding one `mib` MiB file of incompressible bytes (cached)."""
    src = out_dir / f"big-{mib}"
    if not (src / "big.bin").exists():
        src.mkdir(parents=True, exist_ok=True)
        with open(src / "big.bin.tmp", "wb") as f:
            for _ in range(mib):
                f.write(os.urandom(1 << 20))
        os.replace(src / "big.bin.tmp", src / "big.bin")
    return ensure_blob(src, out_dir, f"big-{mib}")


@contextmanager
def registry(work: Path, profile: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(registry URL, link facts): in a shaped netns when possible, else on loopback."""
    if profile != "none" and os.geteuid() == 0:
        try:
            from rollstack.bench.systems.registry import NetnsRegistry
            from rollstack.bench.link.netem import ShapedLink

            with ShapedLink(profile) as link, NetnsRegistry(link, work / "registry") as reg:
                yield reg.url, {"shaped": True, **link.facts()}
            return
        except ImportError:
            pass
    from rollstack.store import RegistryServer

    with RegistryServer(work / "registry-loopback") as server:
        yield server.url, {"shaped": False, "note": "loopback registry, no network shaping"}


@contextmanager
def overlay(lowers: list[Path], scratch: Path, options: str | None = None) -> Iterator[Path]:
    """An overlay of `lowers` (top first) in a fresh dir under `scratch`, unmounted on exit.

    Without `options` it is production's mount (run.overlay.mount_overlay, pinned options).
    With `options` (the overlay-options section's probe of option sets production does not set;
    "" = kernel defaults) it is a `mount -t overlay` with exactly those options.
    """
    from rollstack.host.umount import unmount
    from rollstack.run.overlay import mount_overlay

    d = Path(tempfile.mkdtemp(prefix="ov-", dir=scratch))
    upper, wd, merged = d / "upper", d / "work", d / "merged"
    for p in (upper, wd, merged):
        p.mkdir()
    if options is None:
        mount_overlay(lowers, upper, wd, merged)
    else:
        opts = f"lowerdir={':'.join(map(str, lowers))},upperdir={upper},workdir={wd}" + (f",{options}" if options else "")
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(merged)], check=True)
    try:
        yield merged
    finally:
        unmount(merged)
        shutil.rmtree(d, ignore_errors=True)


def chroot_run(root: Path, env_id: str | None = None, command: str = COMMAND) -> float:
    """Seconds for `command` in a chroot of `root` (in cgroup rollstack/<env_id> if given)."""
    cg = None
    if env_id and CGROUP.parent.exists():
        cg = CGROUP / env_id
        cg.mkdir(parents=True, exist_ok=True)

    def enter() -> None:
        if cg is not None:
            (cg / "cgroup.procs").write_text(str(os.getpid()))

    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    t0 = time.perf_counter()
    r = subprocess.run([CHROOT, str(root), "/bin/sh", "-c", f"cd {WORKDIR} && {command}"], env=env,
                       preexec_fn=enter, capture_output=True, text=True, timeout=300)
    dt = time.perf_counter() - t0
    if cg is not None:
        try:
            cg.rmdir()
        except OSError:
            pass
    if r.returncode != 0:
        raise RuntimeError(f"command failed in chroot: {r.stderr[-2000:]}")
    return dt


def wait_written(lazy: Any, timeout: float = 30.0) -> None:
    """Until the daemon's write-back queue is empty (it writes once reads go quiet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and lazy.stats()["disk_cache"].get("writeback_chunks", 0):
        time.sleep(0.05)


def read_seq(path: Path, block: int = 1 << 20) -> float:
    """MB/s of one sequential read of `path`."""
    t0 = time.perf_counter()
    n = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(block)
            if not b:
                break
            n += len(b)
    return n / (time.perf_counter() - t0) / 1e6


# -- the measurements ----------------------------------------------------------------------------
class Bench:
    def __init__(self, work: Path, store_url: str, refs: list[dict[str, str]], sizes: dict[str, int],
                 registry_data: Path | None = None) -> None:
        self.work, self.store_url, self.refs, self.sizes = work, store_url, refs, sizes
        self.registry_data = registry_data
        self.unpacked_bytes = 0
        self.stack_bytes = sum(sizes[r["digest"]] for r in refs)

    def start(self, name: str, **kw: Any):
        from rollstack.mount.client import LazyStoreClient
        from rollstack.mount.config import DaemonConfig

        state = self.work / "runs" / name
        shutil.rmtree(state, ignore_errors=True)
        return LazyStoreClient.start(DaemonConfig.of(state / "mnt", state / "state", self.store_url, **kw))

    def lowers(self, lazy: Any) -> list[Path]:
        return [lazy.layer_dir(r["digest"]) for r in reversed(self.refs)]

    def cold_and_warm(self, runs: int) -> dict[str, Any]:
        colds, warm_node, warm_page, fetched = [], [], [], []
        detail: dict[str, Any] = {}
        for i in range(runs):
            lazy = self.start(f"cold{i}")
            try:
                drop_page_cache(self.registry_data)
                t0 = time.perf_counter()
                added = lazy.add_layers(self.refs)
                t1 = time.perf_counter()
                with overlay(self.lowers(lazy), self.work) as root:
                    t2 = time.perf_counter()
                    cmd = chroot_run(root)
                    total = time.perf_counter() - t0
                    stats = lazy.stats()["fetch"]
                    colds.append(total)
                    got = stats["transferred_bytes"].get("registry", 0) + added["bytes"]
                    fetched.append(got)
                    if i == 0:
                        detail = {"toc_seconds": round(t1 - t0, 4), "mount_seconds": round(t2 - t1, 4),
                                  "command_seconds": round(cmd, 4), "toc_bytes": added["bytes"],
                                  "registry_requests": stats["requests"].get("registry", 0) + added["requests"],
                                  "chunk_bytes": stats["transferred_bytes"].get("registry", 0)}
                    wait_written(lazy)  # warm = every fetched chunk in the node's disk cache
                    drop_page_cache(self.registry_data)
                    warm_node.append(chroot_run(root))
                    warm_page.append(min(chroot_run(root) for _ in range(5)))
            finally:
                lazy.stop()
        return {
            "cold_seconds": _summary(colds), "cold_first_run": detail,
            "fetched_bytes": int(statistics.median(fetched)), "stack_bytes": self.stack_bytes,
            "fetched_fraction": round(statistics.median(fetched) / self.stack_bytes, 5),
            "stack_unpacked_bytes": self.unpacked_bytes,
            "fetched_fraction_of_unpacked": round(statistics.median(fetched) / self.unpacked_bytes, 5)
            if self.unpacked_bytes else None,
            "warm_node_cache_seconds": _summary(warm_node), "warm_page_cache_seconds": _summary(warm_page),
        }

    def fuse_overhead(self, corpus: Path) -> dict[str, Any]:
        """Warm command time on FUSE lowers vs an overlay of the unpacked directories, 9 runs
        interleaved; the daemon in no-open mode (the default) and serving opens (`kernel-open`),
        side by side. The top level is the default mode."""
        modes: dict[str, Any] = {}
        with overlay([corpus / n for n in reversed(STACK)], self.work) as lroot:
            for mode, no_open in (("no-open", True), ("kernel-open", False)):
                lazy = self.start(f"overhead-{mode}", no_open=no_open)
                try:
                    lazy.add_layers(self.refs)
                    fuse, local = [], []
                    with overlay(self.lowers(lazy), self.work) as froot:
                        chroot_run(froot), chroot_run(lroot)
                        ops0 = lazy.stats()["fuse_ops"]
                        for _ in range(9):  # interleaved, so load from other processes hits both alike
                            fuse.append(chroot_run(froot))
                            local.append(chroot_run(lroot))
                        ops1 = lazy.stats()["fuse_ops"]
                finally:
                    lazy.stop()
                f, loc = statistics.median(fuse), statistics.median(local)
                modes[mode] = {"fuse_warm_seconds": _summary(fuse), "local_overlay_seconds": _summary(local),
                               "ratio_p50": round(f / loc, 3), "ratio_min": round(min(fuse) / min(local), 3),
                               "fuse_requests_per_run": {k: round((v - ops0.get(k, 0)) / len(fuse), 1)
                                                         for k, v in ops1.items() if v > ops0.get(k, 0)
                                                         and not k.startswith("getxattr:")}}
        return {**modes["no-open"], "modes": modes}

    def throughput(self, big_ref: dict[str, str], link_bytes_per_s: float | None) -> dict[str, Any]:
        lazy = self.start("throughput")
        try:
            lazy.add_layers([big_ref])
            path = lazy.layer_dir(big_ref["digest"]) / "big.bin"
            drop_page_cache(self.registry_data)
            uncached = read_seq(path)
            wait_written(lazy, timeout=120.0)
            drop_page_cache(self.registry_data)
            disk = read_seq(path)
            page = read_seq(path)
        finally:
            lazy.stop()
        out = {"uncached_MBps": round(uncached, 1), "node_cache_MBps": round(disk, 1), "page_cache_MBps": round(page, 1)}
        if link_bytes_per_s:
            out["uncached_fraction_of_link"] = round(uncached * 1e6 / link_bytes_per_s, 3)
        return out

    def cold_ablation(self, runs: int, variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """Cold command time and registry GETs per daemon variant, interleaved run by run."""
        rows: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        for i in range(runs):
            for name, kw in variants.items():
                lazy = self.start(f"abl-{name}", **kw)
                try:
                    drop_page_cache(self.registry_data)
                    t0 = time.perf_counter()
                    added = lazy.add_layers(self.refs)
                    with overlay(self.lowers(lazy), self.work) as root:
                        chroot_run(root)
                        total = time.perf_counter() - t0
                    st = lazy.stats()["fetch"]
                    rows[name].append({"seconds": round(total, 4), "stall_seconds": st["stall_seconds"],
                                       "requests": st["requests"].get("registry", 0) + added["requests"],
                                       "bytes": st["transferred_bytes"].get("registry", 0) + added["bytes"]})
                finally:
                    lazy.stop()
        return {name: {"p50_seconds": round(statistics.median(r["seconds"] for r in rs), 4),
                       "stall_p50": round(statistics.median(r["stall_seconds"] for r in rs), 4),
                       "requests_p50": statistics.median(r["requests"] for r in rs),
                       "bytes_p50": statistics.median(r["bytes"] for r in rs), "rows": rs}
                for name, rs in rows.items()}

    def background_interference(self, runs: int, only_modes: tuple[str, ...] = BG_MODES) -> dict[str, Any]:
        """Foreground latency of cold commands with background fill off / on (the gated default)
        / ungated (the old behaviour: no grace, no quiet period, no rate limit), side by side.
        Per run: fresh daemon state, page cache dropped, begin_env, overlay, `python3 -c pass`
        at once, then 4 s later (the fill is running by then) `python3 -m pytest --version`,
        which reads files the first command did not."""
        modes = {"off": (False, {}), "gated": (True, {}),
                 "ungated": (True, {"background_grace": 0.0, "background_quiet": 0.0, "background_share": 0.0})}
        modes = {m: v for m, v in modes.items() if m in only_modes}
        rows: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
        for i in range(runs):
            for mode, (bg, kw) in modes.items():
                lazy = self.start(f"bg-{mode}", **kw)
                try:
                    drop_page_cache(self.registry_data)
                    env = f"bgbench-{mode}-{uuid.uuid4().hex[:6]}"
                    lazy.begin_env(env, self.refs, background=bg)
                    with overlay(self.lowers(lazy), self.work) as root:
                        first = chroot_run(root, env, "python3 -c pass")
                        time.sleep(4.0)
                        b0 = lazy.env_stats(env)["background_bytes"]
                        second = chroot_run(root, env, "python3 -m pytest --version")
                        s = lazy.env_stats(env)
                        gate = lazy.stats().get("background", {})
                    lazy.end_env(env)
                    rows[mode].append({"python_pass_s": round(first, 4), "pytest_version_s": round(second, 4),
                                       "background_bytes_before_second": b0,
                                       "background_bytes_total": s["background_bytes"],
                                       "stall_seconds": s["stall_seconds"], "gate_paused": gate.get("paused")})
                finally:
                    lazy.stop()
        out: dict[str, Any] = {"rows": rows}
        for mode, rs in rows.items():
            out[mode] = {"python_pass_p50": round(statistics.median(r["python_pass_s"] for r in rs), 4),
                         "pytest_version_p50": round(statistics.median(r["pytest_version_s"] for r in rs), 4)}
        off = out.get("off")
        for mode in [m for m in ("gated", "ungated") if m in out and off]:
            out[mode]["pytest_version_vs_off"] = round(out[mode]["pytest_version_p50"] / off["pytest_version_p50"], 3)
            out[mode]["python_pass_vs_off"] = round(out[mode]["python_pass_p50"] / off["python_pass_p50"], 3)
        return out

    def overlay_options(self, corpus: Path, options: list[str]) -> dict[str, Any]:
        """Warm FUSE command time and FUSE getxattr requests per overlay option set (the
        runtime's overlay mount, run/overlay.py, is not ours: this tells it what to use)."""
        lazy = self.start("ovopts")
        out: dict[str, Any] = {}
        try:
            lazy.add_layers(self.refs)
            with overlay([corpus / n for n in reversed(STACK)], self.work) as lroot:
                chroot_run(lroot)
                local = [chroot_run(lroot) for _ in range(5)]
                out["local_overlay_p50"] = round(statistics.median(local), 4)
            for opt in options:
                ops0 = lazy.stats()["fuse_ops"]
                with overlay(self.lowers(lazy), self.work, opt) as root:
                    chroot_run(root)
                    ops1 = lazy.stats()["fuse_ops"]
                    times = [chroot_run(root) for _ in range(5)]
                    ops2 = lazy.stats()["fuse_ops"]
                def delta(a: dict, b: dict, prefix: str) -> int:
                    return sum(v - a.get(k, 0) for k, v in b.items() if k.startswith(prefix))
                out[opt or "default"] = {"warm_p50": round(statistics.median(times), 4),
                                         "ratio_vs_local": round(statistics.median(times) / out["local_overlay_p50"], 3),
                                         "first_run_getxattr": delta(ops0, ops1, "getxattr:"),
                                         "first_run_fuse_requests": delta(ops0, ops1, "") - delta(ops0, ops1, "getxattr:"),
                                         "first_run_getxattr_by_name": {k: v - ops0.get(k, 0) for k, v in ops1.items()
                                                                        if k.startswith("getxattr:") and v - ops0.get(k, 0) > 0},
                                         "warm_run_fuse_requests_by_op": {
                                             k: round((v - ops1.get(k, 0)) / len(times), 1) for k, v in ops2.items()
                                             if v - ops1.get(k, 0) > 0 and not k.startswith("getxattr:")}}
        finally:
            lazy.stop()
        return out

    def traced_command(self, lazy: Any, env: str, key: str) -> tuple[dict[str, Any], float, float, dict[str, Any]]:
        """`begin_env` with trace `key` (no background fill), overlay, the workload in `env`'s
        cgroup, `end_env`: (begin_env's answer, command seconds, total seconds, end_env's stats)."""
        t0 = time.perf_counter()
        began = lazy.begin_env(env, self.refs, trace_key=key, background=False)
        with overlay(self.lowers(lazy), self.work) as root:
            cmd = chroot_run(root, env)
        total = time.perf_counter() - t0
        return began, cmd, total, lazy.end_env(env)

    def shared_trace(self, runs: int) -> dict[str, Any]:
        """Cold node (fresh state dir, empty caches, no local trace) with vs without an access
        trace another node published to the store; interleaved, one fresh key per run."""
        rows: dict[str, list[dict[str, Any]]] = {"without": [], "with": []}
        for i in range(runs):
            key = f"bench-shared-{uuid.uuid4().hex[:8]}"
            seed = self.start(f"seed{i}")
            try:  # another node runs the stack once and publishes its trace
                self.traced_command(seed, f"seed-{i}-{uuid.uuid4().hex[:6]}", key)
                for _ in range(100):
                    if seed.stats()["shared_traces_published"]:
                        break
                    time.sleep(0.05)
            finally:
                seed.stop()
            for mode in ("without", "with"):
                lazy = self.start(f"shared-{mode}{i}", share_traces=mode == "with")
                try:
                    drop_page_cache(self.registry_data)
                    began, cmd, total, s = self.traced_command(lazy, f"shared-{mode}-{i}-{uuid.uuid4().hex[:6]}", key)
                    fetch = lazy.stats()["fetch"]
                    rows[mode].append({"seconds": round(total, 4), "command_seconds": round(cmd, 4),
                                       # final once the trace lookup ended (end_env's stats)
                                       "trace_source": s.get("trace_source"),
                                       "trace_chunks": s["trace_prefetch_chunks"],
                                       "critical_path_bytes": s["critical_path_bytes"],
                                       "prefetch_bytes": s["prefetch_bytes"], "stall_seconds": s["stall_seconds"],
                                       "registry_bytes": fetch["transferred_bytes"].get("registry", 0),
                                       "registry_requests": fetch["requests"].get("registry", 0)})
                finally:
                    lazy.stop()
        out: dict[str, Any] = {}
        for mode, rs in rows.items():
            out[mode] = {"seconds": _summary([r["seconds"] for r in rs]),
                         "critical_path_bytes_p50": int(statistics.median(r["critical_path_bytes"] for r in rs)),
                         "prefetch_bytes_p50": int(statistics.median(r["prefetch_bytes"] for r in rs)),
                         "registry_bytes_p50": int(statistics.median(r["registry_bytes"] for r in rs)),
                         "runs": rs}
        w, wo = out["with"]["seconds"]["p50"], out["without"]["seconds"]["p50"]
        out["speedup_p50"] = round(wo / w, 3) if w else None
        out["note"] = "each cold node starts with an empty state dir; 'with' finds the seed node's trace in the store"
        return out

    def grpo_group(self, n: int) -> dict[str, Any]:
        lazy = self.start("grpo")
        key = f"bench-{uuid.uuid4().hex[:8]}"
        rows = []
        try:
            for i in range(n):
                lazy.drop_caches()
                drop_page_cache(self.registry_data)
                began, cmd, total, s = self.traced_command(lazy, f"grpo-{i}-{uuid.uuid4().hex[:6]}", key)
                rows.append({"rollout": i + 1, "seconds": round(total, 4), "command_seconds": round(cmd, 4),
                             "critical_path_bytes": s["critical_path_bytes"], "prefetch_bytes": s["prefetch_bytes"],
                             "stall_seconds": s["stall_seconds"], "trace_chunks": s["trace_prefetch_chunks"]})
        finally:
            lazy.stop()
        first = rows[0]["critical_path_bytes"]
        rest = statistics.mean(r["critical_path_bytes"] for r in rows[1:]) if n > 1 else 0
        return {"rollouts": rows, "rollout1_critical_bytes": first, "rollouts_2_n_mean_critical_bytes": int(rest),
                "reduction": round(first / rest, 1) if rest else None,
                "note": "node caches dropped between rollouts (each as if on a fresh node); the trace store is kept"}

    def handover(self, runs: int) -> dict[str, Any]:
        """A running environment across a daemon SIGKILL + restart, with and without the fd-holder:
        the environment's overlay runs the command (page cache dropped, so it needs the daemon)
        while no daemon runs; with the holder it waits for the successor, without one it fails."""
        from rollstack.mount.client import LazyStoreClient
        from rollstack.mount.config import DaemonConfig

        out: dict[str, Any] = {}
        for mode, grace in (("holder", 60.0), ("no-holder", 0.0)):
            rows = []
            for i in range(runs):
                state = self.work / "runs" / f"handover-{mode}"
                shutil.rmtree(state, ignore_errors=True)
                config = DaemonConfig.of(state / "mnt", state / "state", self.store_url, holder_grace=grace)
                lazy = LazyStoreClient.start(config)
                successor = None
                try:
                    lazy.add_layers(self.refs)
                    with overlay(self.lowers(lazy), self.work) as root:
                        chroot_run(root)
                        wait_written(lazy)
                        os.kill(lazy.process.pid, signal.SIGKILL)
                        lazy.process.wait()
                        drop_page_cache(self.registry_data)
                        t0 = time.perf_counter()
                        result: dict[str, Any] = {}

                        def command() -> None:
                            try:
                                result["seconds"] = chroot_run(root)
                            except RuntimeError as exc:
                                result["error"] = str(exc)[-300:]

                        th = threading.Thread(target=command)
                        th.start()
                        successor = LazyStoreClient.start(config)
                        ready = time.perf_counter() - t0
                        th.join(120)
                        mode_now = successor.stats()["fuse_mode"]
                        rows.append({"ok": "seconds" in result, "successor_ready_seconds": round(ready, 4),
                                     "command_seconds": result.get("seconds"), "error": result.get("error"),
                                     "takeover": mode_now.get("takeover", False),
                                     "command_after_successor": round(chroot_run(root), 4) if "seconds" in result else None})
                finally:
                    for c in (successor, lazy):
                        if c is not None:
                            c.stop()
            ok = [r for r in rows if r["ok"]]
            out[mode] = {"runs": rows, "env_survived": f"{len(ok)}/{len(rows)}",
                         "successor_ready_p50": round(statistics.median(r["successor_ready_seconds"] for r in rows), 4),
                         "command_p50": round(statistics.median(r["command_seconds"] for r in ok), 4) if ok else None}
        return out


def _summary(xs: list[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4), "n": len(xs)}


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
        _log(f"published in {time.perf_counter() - t0:.1f}s to {url}")
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
            _log("cold/warm")
            doc["init"] = bench.cold_and_warm(runs)
        if "ablation" in only:
            _log("cold ablation")
            doc["cold_ablation"] = bench.cold_ablation(runs, ABLATION)
        if "overhead" in only:
            _log("fuse overhead")
            doc["fuse_overhead"] = bench.fuse_overhead(corpus)
        if "background" in only:
            _log("background fill vs foreground latency")
            doc["background_fill"] = bench.background_interference(max(1, min(runs, 3)), bg_modes)
        if "overlay-options" in only:
            _log("overlay options")
            doc["overlay_options"] = bench.overlay_options(corpus, OVERLAY_OPTIONS)
        if big and "throughput" in only:
            _log("throughput")
            rate = link.get("rate_bit")
            doc["throughput_1GiB"] = bench.throughput({"repo": "bench/big", "digest": big[0]},
                                                      rate / 8 if rate else None)
        if "grpo" in only:
            _log("grpo group")
            doc["grpo"] = bench.grpo_group(rollouts)
        if "sharedtrace" in only:
            _log("cold node with vs without a shared trace")
            doc["shared_trace"] = bench.shared_trace(runs)
        if "handover" in only:
            _log("daemon restart under a running environment, with and without the fd-holder")
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
