"""`bench node`'s summary over a hand-made result document (warm pool and `--image` parts)."""

from __future__ import annotations

from rollstack.bench.node import _summary


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
