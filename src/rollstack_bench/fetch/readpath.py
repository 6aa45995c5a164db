"""`bench fetch`'s read-path sections: cold and warm starts, the FUSE overhead, sequential
throughput, the daemon ablation, background fill against foreground latency, overlay options."""

from __future__ import annotations

import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from rollstack_bench.fetch.rig import STACK, StackRig, chroot_run, drop_page_cache, overlay, read_seq, summary, wait_written

BG_MODES = ("off", "gated", "ungated")


class ReadPathSections(StackRig):
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
            "cold_seconds": summary(colds), "cold_first_run": detail,
            "fetched_bytes": int(statistics.median(fetched)), "stack_bytes": self.stack_bytes,
            "fetched_fraction": round(statistics.median(fetched) / self.stack_bytes, 5),
            "stack_unpacked_bytes": self.unpacked_bytes,
            "fetched_fraction_of_unpacked": round(statistics.median(fetched) / self.unpacked_bytes, 5)
            if self.unpacked_bytes else None,
            "warm_node_cache_seconds": summary(warm_node), "warm_page_cache_seconds": summary(warm_page),
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
                modes[mode] = {"fuse_warm_seconds": summary(fuse), "local_overlay_seconds": summary(local),
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
