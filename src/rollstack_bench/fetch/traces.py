"""`bench fetch`'s trace and daemon sections: a cold node with vs without a shared access trace,
a GRPO group's trace prefetch, and a running environment across a daemon restart (handover)."""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import threading
import time
import uuid
from typing import Any

from rollstack_bench.fetch.rig import StackRig, chroot_run, drop_page_cache, overlay, summary, wait_written


class TraceSections(StackRig):
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
            out[mode] = {"seconds": summary([r["seconds"] for r in rs]),
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
        from rollstack.lazystore.client import LazyStoreClient
        from rollstack.lazystore.config import DaemonConfig

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
