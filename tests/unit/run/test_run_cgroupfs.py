"""`run.cgroupfs.release_page_cache`'s choices over a stand-in cgroup dir (its files only): which
interface it writes, what, and when it leaves the cgroup alone. The real kernel's answer is
tests/integration/run/test_run_cgroupfs_release.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollstack.run.cgroupfs import release_page_cache, stat_value

V1_STAT = "cache 8192\nrss 0\nmapped_file 0\ntotal_cache 12288\ntotal_rss 0\n"


def _v1(tmp_path: Path, stat: str = V1_STAT) -> Path:
    (tmp_path / "memory.stat").write_text(stat)
    (tmp_path / "memory.force_empty").write_text("")
    return tmp_path


def _v2(tmp_path: Path, file: int, current: int) -> Path:
    (tmp_path / "memory.stat").write_text(f"anon 0\nfile {file}\nkernel 4096\n")
    (tmp_path / "memory.current").write_text(f"{current}\n")
    (tmp_path / "memory.reclaim").write_text("")
    return tmp_path


def test_stat_value_takes_the_first_key_present() -> None:
    assert stat_value(V1_STAT, "total_cache", "cache") == 12288
    assert stat_value("cache 8192\n", "total_cache", "cache") == 8192
    assert stat_value("cache x\n", "cache") is None and stat_value("", "cache") is None


def test_v1_small_charge_is_force_emptied(tmp_path: Path) -> None:
    cg = _v1(tmp_path)
    assert release_page_cache(cg, below=1 << 20)
    assert (cg / "memory.force_empty").read_text() == "0"


def test_v1_the_first_readers_large_charge_is_kept(tmp_path: Path) -> None:
    cg = _v1(tmp_path, "total_cache 4194304\n")
    assert not release_page_cache(cg, below=1 << 20)
    assert (cg / "memory.force_empty").read_text() == ""


def test_v2_reclaims_what_is_charged(tmp_path: Path) -> None:
    cg = _v2(tmp_path, file=8192, current=20480)
    assert release_page_cache(cg, below=1 << 20)
    assert (cg / "memory.reclaim").read_text() == "20480"


@pytest.mark.parametrize("file,current", [(8 << 20, 9 << 20), (0, 0)])
def test_v2_large_or_empty_is_left_alone(tmp_path: Path, file: int, current: int) -> None:
    cg = _v2(tmp_path, file=file, current=current)
    assert not release_page_cache(cg, below=1 << 20)
    assert (cg / "memory.reclaim").read_text() == ""


def test_other_hierarchies_and_unreadable_stats_are_left_alone(tmp_path: Path) -> None:
    assert not release_page_cache(tmp_path)  # cpu, pids, ...: no memory files
    cg = _v1(tmp_path, "total_cache garbage\n")
    assert not release_page_cache(cg)
    (cg / "memory.stat").unlink()
    assert not release_page_cache(cg)  # the cgroup went away meanwhile: OSError, no raise
