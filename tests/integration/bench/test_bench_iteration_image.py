"""`bench iteration --image` end to end on a tiny single-layer image (busybox tree packed like
`bench.images` packs its images): import + push, then rollstack and containerd each a cold and a
warm iteration of 2 tasks x 2 rollouts over the real link, registry, node and containerd. Every
rollout's steps succeed and its evaluation (a second clean environment that checks the rollout's
answer) gives reward 1.0; the report has every phase median and ratio. No timing asserts."""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

import pytest

from components import need, require_root
from rollstack_bench.systems.containerd import available

pytestmark = pytest.mark.integration

EXTRA_APPLETS = ("find", "sha256sum", "base64", "tar", "xargs", "sort")
"""what the image tasks' write, evaluation and containerd's carry-over need besides bench.env's"""


def test_bench_iteration_on_an_imported_image(tmp_path: Path) -> None:
    require_root()  # netns, FUSE, overlayfs, runc, containerd: a failure in CI, a skip elsewhere
    need(available() is None, f"containerd for the baseline ({available()})")
    from rollstack_bench.env import build_busybox_trees
    from rollstack_bench.images import write_single_layer_layout
    from rollstack_bench.iteration.image_run import ImageIterConfig, run_image_iteration, write_image_report

    trees = build_busybox_trees(tmp_path / "trees")
    for applet in EXTRA_APPLETS:
        os.symlink("busybox", trees["os"] / "bin" / applet)
    layout = tmp_path / "tiny-image"
    write_single_layer_layout(trees["os"], layout)
    before_ns = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    cfg = ImageIterConfig(images=[f"oci:{layout}:latest"], commands=["ls /bin >/dev/null"],
                          task_commands=["find /bin -xdev | wc -l", "cat /bin/* | wc -c", "ls /bin >/dev/null"],
                          tasks=2, rollouts=2, concurrency=2,
                          work=Path("/var/cache/rollstack/bench-iteration-image-test"), log=lambda m: None)
    doc = run_image_iteration(cfg)
    assert set(doc["systems"]) == {"rollstack-cold", "rollstack-warm", "docker-equivalent-cold", "docker-equivalent-warm"}
    for name, rs in doc["rollouts"].items():
        assert len(rs) == 4, name
        bad = [r for r in rs if r["error"] or r["reward"] != 1.0]
        assert not bad, (name, [(r["error"], r["reward"], r.get("message")) for r in bad])
        for r in rs:
            assert set(r["steps"]) == {"step-1", "step-2", "step-3", "write"} and not any(r["steps"].values()), r
            assert [p["name"] for p in r["phases"]] == ["init", "exec", "eval", "destroy"]
            assert r["eval_cmd_s"] > 0 and set(r["step_s"]) == set(r["steps"])
    # the import published the layer's EROFS image, so even a fresh node's first environments
    # stack its EROFS mount, never the FUSE directory (without file-backed EROFS: always FUSE)
    from rollstack.lowers.erofs import supported

    assert all(r["fuse_lowers"] is (not supported()) for r in doc["rollouts"]["rollstack-cold"])
    assert all(r["fuse_lowers"] is None for r in doc["rollouts"]["docker-equivalent-cold"])
    for name, s in doc["systems"].items():
        assert s["ok"] == 4 and 0 < s["init_share"] < 1 and s["exec_p50"] > 0, name
        assert set(s["steps_p50"]) == {f"tiny-image:{k}" for k in ("step-1", "step-2", "step-3", "write")}
    for mode in ("cold", "warm"):
        r = doc["ratios"][mode]
        assert all(r[k] > 0 and not math.isnan(r[k]) for k in ("iteration_s", "exec_p50", "eval_p50")), r
        assert len(r["steps"]) == 4
    assert doc["imports"][f"oci:{layout}:latest"]["converted"] == 1
    written = write_image_report(doc, tmp_path / "out")
    assert "exec" in (tmp_path / "out" / "results.md").read_text() and Path(written["timeline_rollstack-cold"]).is_file()
    after_ns = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    assert not {n for n in after_ns - before_ns if n.startswith(f"rs-bench-{os.getpid()}-")}
