"""`bench node`'s summary over a hand-made result document (warm pool and `--image` parts)."""

from __future__ import annotations

from rollstack_bench.node import _summary


def _burst(rate: float, drained: float, hits: int = 0) -> dict:
    return {"envs_per_s": rate, "drained_envs_per_s": drained, "failures": 0, "warm_hits": hits,
            "first_exec": {"n": 128, "p50": 1.0, "p99": 1.2}}


def _doc(image: bool) -> dict:
    doc = {
        "warm_pool": 128,
        "agent": {"exec_true": {"p50": 0.002, "node_cpu_per_exec_s": 0.001},
                  "throughput": {"execs_per_s": 400.0}, "fanout": {"ratio": 2.5},
                  "bursts": [_burst(40, 20, 128), _burst(30, 18, 128)], "admitted_small_envs": 96},
        "runc": {"exec_true": {"p50": 0.04, "node_cpu_per_exec_s": 0.02}},
        "containerd": {"exec_true": {"p50": 0.05, "cpu_per_exec_s": 0.03},
                       "bursts": [_burst(10, 10), _burst(5, 5)]},
    }
    if image:
        doc["image"] = {"ref": "oci:x", "fanout": {"ratio": 4.0}, "bursts": [_burst(20, 10)]}
        doc["containerd"]["image_bursts"] = [_burst(8, 8)]
    return doc


def test_summary_compares_bursts_and_reports_the_pool() -> None:
    s = _summary(_doc(image=False))
    assert s["warm_pool"] == 128
    assert s["burst_vs_containerd"] == round(35 / 7.5, 2)
    assert "image_burst_vs_containerd" not in s


def test_summary_of_the_image_part() -> None:
    s = _summary(_doc(image=True))
    assert s["image_fanout_ratio"] == 4.0 and s["image_burst_failures"] == 0
    assert s["image_burst_vs_containerd"] == 2.5


def test_fanout_document_and_summary_report_both_modes_create_only_and_with_exec() -> None:
    from rollstack_bench.node_fanout import summarize

    one = [(0.010, 0.020, 0.01, 0.01, True), (0.012, 0.022, 0.0, 0.01, True), (0.011, 0.021, 0.01, 0.02, True)]
    many = [(0.030, 0.060, 0.04, 0.06, True), (0.034, 0.064, 0.05, 0.07, False), (0.032, 0.062, 0.03, 0.05, True)]
    warm = summarize(one, many, 8, 16, [{"count": 8.0, "begin": 0.003}, {"count": 8.0, "begin": 0.005}])
    assert (warm["one_create_s"], warm["group_create_s"], warm["create_ratio"]) == (0.011, 0.032, 2.91)
    assert (warm["one_s"], warm["group_s"], warm["ratio"]) == (0.021, 0.062, 2.95)
    assert warm["group_create_node_cpu_s"] == 0.04 and warm["one_create_node_cpu_s"] == round(0.02 / 3, 6)
    assert warm["create_node_cpu_per_extra_env_s"] == round((0.04 - 0.02 / 3) / 7, 6)
    assert warm["all_warm_rounds"] == 2 and warm["group_shared_phases_s"]["begin"] == 0.004
    cold = summarize(one, many, 8, 0, [])
    assert "group_shared_phases_s" not in cold
    doc = _doc(image=False)
    doc["agent"]["fanout"], doc["fanout_other"] = warm, cold
    s = _summary(doc)
    assert s["fanout_ratio"] == 2.95  # the key that existed: create + exec, the run's own mode
    assert (s["fanout_warm_create_ratio"], s["fanout_cold_ratio"]) == (2.91, 2.95)
    assert s["fanout_warm_cpu_ms_per_extra_env"] == round(warm["create_node_cpu_per_extra_env_s"] * 1e3, 2)
    old = _summary(_doc(image=False))  # a document without the new fan-out fields
    assert old["fanout_ratio"] == 2.5 and "fanout_warm_ratio" not in old
