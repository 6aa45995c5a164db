"""`rollstack bench fork` end to end at a tiny size: every section present, the children saw the
parent's files (checked inside the benchmark), the snapshot restored on a fresh node, the
checkpointed process went on, and the cycles left nothing. No timing is asserted."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from rollstack_bench.fork import run

pytestmark = pytest.mark.integration


def test_fork_bench_small():
    work = Path(tempfile.mkdtemp(prefix="rsn-bench-fork-", dir="/var/tmp"))
    try:
        doc = run(files=20, file_kib=1, big_mib=1, reps=3, cycles=3, work=work, command="test", log=lambda m: None)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for section in ("small", "small_quiet", "small_cold", "small_on_disk"):
        assert doc[section]["fork_1"]["reps"] == 3 and doc[section]["fork_8"]["count"] == 8
    # with the pool refilled before each fork every child takes a late-bound sandbox; set aside, none
    assert doc["small_quiet"]["fork_8"]["late_bound_children"] == "16/16"
    assert doc["small_cold"]["fork_1"]["late_bound_children"] == "0/3"
    assert doc["small_cold"]["fork_8"]["late_bound_children"] == "0/16"
    # children with a network take late-bound sandboxes too (their slot set up after the bind)
    assert doc["network"]["fork_8"]["late_bound_children"] == "16/16"
    assert doc["network"]["cold_fork_8"]["late_bound_children"] == "0/16"
    assert doc["small"]["fork_1"]["layers_in_memory"] == "3/3"
    assert doc["small_on_disk"]["fork_1"]["layers_in_memory"] == "0/3"
    assert doc["small"]["fork_1"]["child_start_p50_s"] > 0
    assert doc["snapshot"]["restored"] and doc["snapshot"]["files"] >= 21
    assert doc["checkpoint"]["process_goes_on"] and doc["checkpoint"]["dump_bytes_p50"] > 0
    assert doc["checkpoint"]["exec_p50_after_restore_s"] > 0
    floor = doc["runc_floor"]
    assert floor["run_1_p50_s"] > 0 and floor["run_8_p50_s"] > 0
    assert floor["left"] == []  # every bare container deleted
    assert doc["cycles"]["n"] == 3 and doc["left_after_cycles"] == []
    assert doc["goals"]["cycles_leave_nothing"] and set(doc["goals"]) >= {"fork_1_small_le_100ms", "fork_8_le_1_5x_fork_1",
                                                                   "fork_8_le_1_5x_fork_1_quiet"}
