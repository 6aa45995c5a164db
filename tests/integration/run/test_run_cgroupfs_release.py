"""`run.cgroupfs.release_page_cache` against the kernel (root, a real memory cgroup): the page
cache a process in an emptied cgroup read first is uncharged (and so the cgroup is freed at
rmdir, not left dying) when small, and kept when it is a stack's shared working set; and the
runtime's destroy does it for a real environment's cgroup."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from rollstack.host.cgroups import cgroup_mounts
from rollstack.run import cgroupfs

pytestmark = pytest.mark.integration


def _memory_root() -> Path:
    for mp, kind in cgroup_mounts():
        if kind == "cgroup" and Path(mp).name == "memory" or \
                kind == "cgroup2" and "memory" in (Path(mp) / "cgroup.controllers").read_text().split():
            return Path(mp)
    raise AssertionError("no memory cgroup hierarchy is mounted")


def _charged(cg: Path) -> int:
    text = (cg / "memory.stat").read_text()
    value = cgroupfs.stat_value(text, "total_cache", "file")
    assert value is not None, text
    return value


@pytest.fixture
def cgroup():
    root = _memory_root()
    cg = root / f"rollstack-test-{uuid.uuid4().hex[:8]}"
    cg.mkdir()
    try:
        yield cg
    finally:
        cgroupfs.remove_cgroup(cg)


def _read_in(cg: Path, path: Path) -> None:
    """A process that joins `cg`, reads `path` (charging its page cache to `cg`) and exits."""
    subprocess.run(["sh", "-c", f'echo $$ > "{cg}/cgroup.procs" && cat "{path}" > /dev/null'], check=True)
    assert not (cg / "cgroup.procs").read_text().split()


def _fresh_file(tmp_path: Path, size: int) -> Path:
    f = tmp_path / f"data-{uuid.uuid4().hex[:8]}"
    f.write_bytes(os.urandom(size))
    fd = os.open(f, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # out of the page cache: the reader charges it
    finally:
        os.close(fd)
    return f


def test_a_small_charge_is_released(cgroup: Path, tmp_path: Path) -> None:
    _read_in(cgroup, _fresh_file(tmp_path, 256 << 10))
    assert _charged(cgroup) >= 128 << 10
    assert cgroupfs.release_page_cache(cgroup, below=1 << 20)
    assert _charged(cgroup) == 0


def test_a_large_charge_is_kept(cgroup: Path, tmp_path: Path) -> None:
    _read_in(cgroup, _fresh_file(tmp_path, 2 << 20))
    before = _charged(cgroup)
    assert before >= 1 << 20
    assert not cgroupfs.release_page_cache(cgroup, below=1 << 20)
    assert _charged(cgroup) == before


def test_destroy_releases_an_environments_small_charge(make_env, busybox_lower: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Through `EnvironmentRuntime`'s destroy: the memory cgroup of an environment that read a
    file no one had read is emptied before its rmdir."""
    lower = tmp_path / "data-lower"
    lower.mkdir()
    _fresh_file(lower, 256 << 10).rename(lower / "blob")
    env = make_env(lowers=[lower, busybox_lower])
    assert env.exec(["cat", "/blob"]).exit_code == 0
    released: list[tuple[Path, int, bool]] = []
    real = cgroupfs.release_page_cache

    def spy(cg: Path, below: int = cgroupfs.RELEASE_BELOW) -> bool:
        charged = _charged(cg) if (cg / "memory.stat").exists() else -1
        # the threshold is tested above; here, that destroy empties the cgroup it charged, however
        # much else it read (a machine dropping its caches makes it re-read busybox: over 1 MiB)
        released.append((cg, charged, real(cg, max(below, 64 << 20))))
        return released[-1][2]

    monkeypatch.setattr(cgroupfs, "release_page_cache", spy)
    env.destroy()
    memory = [r for r in released if r[1] >= 0]
    assert len(memory) == 1 and memory[0][1] >= 128 << 10 and memory[0][2], released
    assert not memory[0][0].exists()
