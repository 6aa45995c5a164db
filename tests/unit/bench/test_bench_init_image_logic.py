"""Pure parts of `bench init --image` and `bench exec`: names, summaries, targets."""

from __future__ import annotations

import pytest

from rollstack_bench.exec_overhead import summarize
from rollstack_bench.init_image import image_name, summary, targets
from rollstack.lazystore.priority import raise_fuse_thread_priority


def test_image_names():
    assert image_name("oci:/var/cache/x/python-project:latest") == "bench-image/python-project"
    assert image_name("oci:/var/cache/x/node-project") == "bench-image/node-project"
    assert image_name("localhost:5000/team/My_Image:v1") == "bench-image/my_image"


def test_summary_and_targets():
    s = summary([{"kind": "containerd_cold", "first_cmd_s": 30.0}, {"kind": "containerd_cold", "first_cmd_s": 20.0},
                 {"kind": "rollstack_first_ever", "first_cmd_s": 2.0},
                 {"kind": "rollstack_shared_trace", "first_cmd_s": 0.8}, {"kind": "rollstack_shared_trace", "first_cmd_s": 1.2}])
    assert s["containerd_cold"]["p50"] == 25.0 and s["rollstack_shared_trace"]["p50"] == 1.0
    assert s["rollstack_shared_trace"]["speedup_vs_containerd_cold"] == 25.0
    t = targets(s)
    assert t["shared_trace_cold_s"]["met"] is True and t["first_ever_cold_s"]["met"] is False
    assert t["shared_trace_speedup"]["met"] is True
    assert targets({}) == {}


def test_warm_next_is_compared_with_containerd_warm():
    s = summary([{"kind": "containerd_warm", "first_cmd_s": 1.0}, {"kind": "containerd_warm", "first_cmd_s": 1.2},
                 {"kind": "rollstack_warm_next", "first_cmd_s": 1.21}, {"kind": "rollstack_warm_materialized", "first_cmd_s": 0.9}])
    assert s["rollstack_warm_next"]["vs_containerd_warm"] == pytest.approx(1.1)
    assert s["rollstack_warm_materialized"]["vs_containerd_warm"] == pytest.approx(0.9 / 1.1)
    assert targets(s)["warm_next_vs_containerd_warm"]["met"] is False  # never slower than containerd warm


def test_exec_summary_ratio():
    out = summarize([{"system": "rollstack", "commands": {"a": 1.2}}, {"system": "rollstack", "commands": {"a": 1.4}},
                     {"system": "docker-equivalent", "commands": {"a": 1.0}}])
    assert out["rollstack"]["a"]["p50"] == pytest.approx(1.3) and out["ratio"]["a"] == pytest.approx(1.3)
    out = summarize([{"system": "rollstack", "commands": {"a": 1.2}},
                     {"system": "rollstack-nolinger", "commands": {"a": 1.5}},
                     {"system": "docker-equivalent", "commands": {"a": 1.0}}])
    assert out["ratio"]["a"] == pytest.approx(1.2) and out["ratio_nolinger"]["a"] == pytest.approx(1.5)


def test_fuse_priority_rejects_unknown_modes():
    with pytest.raises(ValueError):
        raise_fuse_thread_priority("fast")
    assert raise_fuse_thread_priority("normal") == "normal"
