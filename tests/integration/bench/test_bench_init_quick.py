"""`rollstack bench init --quick` as a smoke test: every system, real link/registry/containerd/node.

No timing assertions (benchmarks measure speed): the document has interface.md's shape, every
system produced numbers, every first command succeeded, rollstack fetched less than the whole stack
before ready (and rollstack-eager fetched more than it), the report files were written, and
nothing (namespace, containerd, node daemon, mounts) is left behind.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
from components import need

from rollstack_bench.systems.containerd import available

# every system end to end (containerd, a registry behind a shaped link, the node): minutes on a
# busy machine; the deadline is generous, not a speed assertion
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

WORK = Path("/var/cache/rollstack/bench-init-test")  # kept between runs: images and groups are cached


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (netns, FUSE, overlayfs, runc, containerd)"
    if not Path("/usr/bin/docker-registry").exists():
        return "docker-registry not installed"
    return available()


def test_bench_init_quick_all_systems(tmp_path: Path) -> None:
    need(_skip_reason() is None, str(_skip_reason()))
    from rollstack_bench.init import InitConfig, default_corpus, run_init, write_report
    from rollstack_bench.systems.rollstack import SYSTEM_NAMES

    before_ns = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    cfg = InitConfig(corpus=default_corpus(quick=True), cold=1, warm=1, work=WORK)
    doc = run_init(cfg)
    doc["machine"], doc["command"] = {"cores": os.cpu_count()}, "pytest"
    written = write_report(doc, tmp_path / "out")

    assert set(doc["systems"]) == set(SYSTEM_NAMES)
    for name, s in doc["systems"].items():
        for key in ("cold_init_p50", "cold_init_p95", "warm_init_p50", "fetched_fraction"):
            assert isinstance(s[key], float) and not math.isnan(s[key]) and s[key] > 0, (name, key, s[key])
        assert s["failures"] == 0, (name, doc["samples"][name])
    stack = doc["stack"]["bytes"]
    assert doc["systems"]["rollstack"]["cold_fetched_bytes_p50"] < stack
    assert doc["systems"]["rollstack"]["fetched_fraction"] < doc["systems"]["rollstack-eager"]["fetched_fraction"]
    assert set(doc["targets"]) == {"cold_speedup_p50", "warm_init_p50_s", "fetched_fraction"}

    saved = json.loads(Path(written["json"]).read_text())
    assert {"systems", "machine", "command"} <= set(saved)
    assert Path(written["init_cdf"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| rollstack |" in Path(written["markdown"]).read_text()

    # cleanup: the rig's namespace is gone, no containerd/daemon of ours runs, no mounts under WORK
    after_ns = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    assert not {n for n in after_ns - before_ns if n.startswith(f"rs-bench-{os.getpid()}-")}
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(WORK) not in mounts
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"--config {WORK}/ctd" not in ps
    assert f"--mountpoint {WORK}/node-" not in ps
