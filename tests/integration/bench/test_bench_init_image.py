"""`bench init --image` end to end on a tiny single-layer image (busybox tree packed like
`bench.images` packs its images): import (then a re-import that converts nothing), containerd
cold/warm, rollstack first-ever / warm on FUSE / warm materialized over the real link, registry,
containerd and node; every command succeeds and the document has every figure. No timing asserts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from components import need, require_root
from rollstack_bench.systems.containerd import available

pytestmark = pytest.mark.integration


def test_bench_init_image_on_a_single_layer_layout(tmp_path: Path) -> None:
    require_root()  # netns, FUSE, overlayfs, runc, containerd: a failure in CI, a skip elsewhere
    need(available() is None, f"containerd for the baseline ({available()})")
    from rollstack_bench.env import build_busybox_trees
    from rollstack_bench.images import write_single_layer_layout
    from rollstack_bench.init_image import ImageInitConfig, run_init_image

    trees = build_busybox_trees(tmp_path / "trees")
    layout = tmp_path / "img"
    packed = write_single_layer_layout(trees["os"], layout)
    assert packed["layer_size"] > 0
    before_ns = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    doc = run_init_image(ImageInitConfig(image=f"oci:{layout}:latest", command="ls /bin >/dev/null && echo ok",
                                         cold=1, warm=1, work=Path("/var/cache/rollstack/bench-init-image-test"),
                                         log=lambda m: None))
    kinds = {s["kind"] for s in doc["samples"]}
    assert kinds == {"containerd_cold", "containerd_warm", "rollstack_first_ever", "rollstack_warm_next",
                     "rollstack_warm_materialized"}
    assert all(s["exit_code"] == 0 for s in doc["samples"]), [s for s in doc["samples"] if s["exit_code"]]
    assert doc["import"]["converted"] == 1 and doc["import"]["reimport_converted"] == 0
    assert doc["import"]["unpacked_bytes"] > 0 and doc["materializer"]["stats"]["materialized"] == 1
    assert set(doc["summary"]) >= kinds and "first_ever_cold_s" in doc["targets"]
    after_ns = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    assert not {n for n in after_ns - before_ns if n.startswith(f"rs-bench-{os.getpid()}-")}


def test_bench_prefetch_fetches_the_probed_trace_by_every_plan(tmp_path: Path) -> None:
    """`bench prefetch`: import, probe (trace published), then the trace fetched by each request
    plan over the real link and registry; multi-range never needs more GETs than single ranges."""
    require_root()  # fails in CI when missing, skips on a developer machine
    from rollstack_bench.env import build_busybox_trees
    from rollstack_bench.images import write_single_layer_layout
    from rollstack_bench.prefetch import PLANS, run

    trees = build_busybox_trees(tmp_path / "trees")
    layout = tmp_path / "img"
    write_single_layer_layout(trees["os"], layout)
    doc = run(f"oci:{layout}:latest", "ls -R /bin /etc >/dev/null && cat /bin/busybox >/dev/null", rounds=1,
              work=Path("/var/cache/rollstack/bench-prefetch-test"), plans=list(PLANS), log=lambda m: None)
    assert doc["trace_chunks"] > 0 and set(doc["summary"]) == set(PLANS)
    for plan, s in doc["summary"].items():
        assert s["requests"] >= 1 and s["link_mb"] * 1e6 >= doc["trace_stored_mb"] * 1e6 - 1, plan
    assert doc["summary"]["multi-range"]["requests"] <= doc["summary"]["growing"]["requests"]


def test_bench_materialize_runs_the_command_beside_the_nodes_extraction(tmp_path: Path) -> None:
    """`bench materialize`: an environment on FUSE lowers runs the command idle and while the
    node's own extraction (in its background cgroup) runs; the trees are removed afterwards."""
    require_root()
    from rollstack_bench.env import build_busybox_trees
    from rollstack_bench.images import write_single_layer_layout
    from rollstack_bench.materialize import run

    trees = build_busybox_trees(tmp_path / "trees")
    layout = tmp_path / "img"
    write_single_layer_layout(trees["os"], layout)
    work = Path("/var/cache/rollstack/bench-materialize-test")
    doc = run(f"oci:{layout}:latest", "true", rounds=1, runs=3, work=work, source="registry", cpu=0.5,
              log=lambda m: None)
    s = doc["summary"]
    assert s["runs_idle"] == 3 and 1 <= s["runs_extracting"] <= 3 and s["extract_wall_s"] > 0
    assert s["ratio"] > 0 and doc["materialize_cpu"] == 0.5
    assert not list(work.glob("rs-bench-mat-*"))  # every extracted tree removed
