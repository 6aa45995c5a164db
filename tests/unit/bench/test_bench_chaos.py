"""`bench chaos`'s pure parts: which lost rollouts a fault hit, and the agent's flatness."""

from __future__ import annotations

from rollstack_bench.chaos import Rollout, attribute, fd_kind, flatness
from rollstack_bench.chaos_faults import Fault


def _r(start: float, end: float, error: str | None, *envs: str) -> Rollout:
    return Rollout("w0", start, end, list(envs), error)


def test_a_rollout_is_lost_to_a_fault_only_when_the_fault_hit_it() -> None:
    faults = [Fault("kill_env_init", 10, 10.1, target="e1"),
              Fault("kill_agent", 20, 22),  # node-wide: its window, plus the grace
              Fault("kill_exec_shim", 30, 30, target="e9", skipped=True)]
    rollouts = [
        _r(0, 5, None, "e0"),  # completed: not counted
        _r(8, 12, "environment_gone", "e1"),  # its environment was the target
        _r(21, 23, "node_unavailable", "e2"),  # during the agent's restart
        _r(26, 27, "node_unavailable", "e3"),  # within the grace after it
        _r(40, 41, "runtime_error", "e4"),  # nothing hit it: ours
        _r(29, 31, "environment_gone", "e9"),  # the only fault on it was skipped: ours
        _r(21, 22, "internal_error", "e5"),  # a bug is never a fault's doing
    ]
    out = attribute(rollouts, faults, grace=5.0)
    assert out["lost_to_faults"] == 3 and out["lost_unattributed"] == 3
    assert sorted(u["envs"][0] for u in out["unattributed"]) == ["e4", "e5", "e9"]
    assert out["unattributed_by_code"] == {"runtime_error": 1, "environment_gone": 1, "internal_error": 1}
    assert out["lost_to_faults_by_code"] == {"environment_gone": 1, "node_unavailable": 2}
    assert out["lost_to_faults_by_fault"] == {"environment_gone under kill_env_init": 1,
                                              "node_unavailable under kill_agent": 2}


def test_flatness_compares_the_first_and_last_quarters() -> None:
    samples = [(float(t), 100 + (t // 10), 50 << 20) for t in range(40)]
    out = flatness(samples)
    assert out["fds_first_quarter"] == 100 and out["fds_last_quarter"] == 103
    assert out["rss_mb_first_quarter"] == out["rss_mb_last_quarter"] == 50.0
    assert flatness(samples[:3]) == {"samples": 3}
    minutes = flatness([(float(t), 100 + t // 60, 50 << 20, 3 + t // 60) for t in range(150)])["per_minute"]
    assert minutes == [{"minute": m, "fds": 100 + m, "rss_mb": 50.0, "envs": 3 + m, "fd_kinds": None} for m in range(3)]
    kinds = flatness([(float(t), 100, 50 << 20, 3, {"socket": t}) for t in range(90)])["per_minute"]
    assert [m["fd_kinds"] for m in kinds] == [{"socket": 59}, {"socket": 89}]


def test_fd_kind_groups_descriptors_by_what_they_point_at() -> None:
    assert fd_kind("socket:[4242]") == "socket"
    assert fd_kind("pipe:[17]") == "pipe"
    assert fd_kind("anon_inode:[eventpoll]") == "anon_inode:[eventpoll]"
    assert fd_kind("/var/tmp/rollstack-bench-chaos-a1_b2/node/envs/env-0f3c9a1b/upper/x/y") == \
        "/var/tmp/*/node/envs/*/upper"
    assert fd_kind("/dev/fuse") == "/dev/fuse"
