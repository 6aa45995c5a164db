"""The background cgroup's settings (pure) and the choice of hierarchies."""

from __future__ import annotations

import pytest

from rollstack.host import background


def test_settings_cap_and_weight_for_v1_and_v2():
    assert background.settings(0.5, 1) == {"cpu.shares": "2", "cpu.cfs_period_us": "100000",
                                           "cpu.cfs_quota_us": "50000"}
    assert background.settings(0.5, 2) == {"cpu.weight": "1", "cpu.max": "50000 100000"}
    assert background.settings(0, 1)["cpu.cfs_quota_us"] == "-1"  # lowest share, no cap
    assert background.settings(0, 2)["cpu.max"] == "max 100000"
    assert background.settings(0.001, 1)["cpu.cfs_quota_us"] == "1000"  # the kernel's minimum
    with pytest.raises(ValueError):
        background.settings(-1, 1)


def test_only_hierarchies_with_the_cpu_controller_are_used(tmp_path):
    v1cpu, v1mem, v2 = tmp_path / "cpu", tmp_path / "memory", tmp_path / "unified"
    for d in (v1cpu, v1mem, v2):
        d.mkdir()
    (v1cpu / "cpu.cfs_quota_us").write_text("-1")
    (v2 / "cgroup.controllers").write_text("memory pids\n")  # cpu bound to v1 (hybrid)
    roots = background._cpu_roots([(str(v1cpu), "cgroup"), (str(v1mem), "cgroup"), (str(v2), "cgroup2")])
    assert roots == [(v1cpu, 1)]
    (v2 / "cgroup.controllers").write_text("cpu memory\n")
    assert (v2, 2) in background._cpu_roots([(str(v2), "cgroup2")])


def test_a_bad_tag_is_refused():
    for tag in ("", "a/b", ".."):
        with pytest.raises(ValueError):
            background.create(tag, 0.5, mounts=[])
