"""`rollstack bench isolation` end to end at a tiny size: every section present, nothing leaked."""

from __future__ import annotations

import pytest

from rollstack_bench.isolation import run

pytestmark = pytest.mark.integration


def test_isolation_bench_small():
    import shutil
    import tempfile
    from pathlib import Path

    work = Path(tempfile.mkdtemp(prefix="rsn-bench-", dir="/var/tmp"))  # searchable parents (userns)
    try:
        doc = run(work, creates=1, cycles=3, reps=1, command="test")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    net = doc["network"]
    assert set(net["create"]) >= {"none", "allow_cold", "allow_warm", "none_userns", "allow_userns", "warm_pool"}
    assert net["create"]["allow_userns"]["network"]["median"] > 0  # set up after start, cold
    assert net["create"]["allow_warm"]["network"]["median"] > 0
    assert net["cycles"]["count"] == 3 and net["cycles"]["leaked"] == 0
    assert net["throughput"]["through_policy_MBps"] > 0 and net["throughput"]["link_MBps"] > 0
    g = doc["gvisor"]
    assert set(g) >= {"runc", "runc+userns", "runsc", "slowdown", "userns_ratio"}
    assert g["runsc"]["syscalls_dd_bs1_200k"]["median"] > 0
