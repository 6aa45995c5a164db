"""The fork store (rollstack.node.forks.ForkLayers) on a real tmpfs and a real disk: where a
frozen upper lands, what falls back to disk, what stop and collect leave.

The environment here is an upper dir whose `cut()` runs a callback: the store needs nothing more
of it (freezing a real one is test_node_fork.py's)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Iterator

import pytest

from rollstack.host.mountinfo import is_mounted
from rollstack.host.umount import unmount
from rollstack.node.forks import ForkLayers, layer_names


class Upper:
    def __init__(self, upper: Path, during_cut: Callable[[], None] = lambda: None) -> None:
        self.upper = upper
        self.during_cut = during_cut
        self.cuts = 0

    @contextlib.contextmanager
    def cut(self) -> Iterator[None]:
        self.cuts += 1
        self.during_cut()
        yield


def _fill(upper: Path, files: int, size: int) -> None:
    (upper / "d").mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (upper / "d" / f"f{i}").write_bytes(bytes([i % 251]) * size)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Callable[[int], ForkLayers]]:
    made: list[ForkLayers] = []

    def make(memory: int) -> ForkLayers:
        forks = ForkLayers(tmp_path / "forks", memory)
        forks.start()
        made.append(forks)
        return forks

    yield make
    for forks in made:
        if is_mounted(forks.mem):
            unmount(forks.mem)


def test_a_small_layer_is_copied_to_memory_and_stop_unmounts_once_none_is_left(store, tmp_path: Path) -> None:
    forks = store(8 << 20)
    assert is_mounted(forks.mem)
    _fill(tmp_path / "upper", 100, 1000)
    layer, cut = forks.freeze(Upper(tmp_path / "upper"))
    forks.settle(layer)
    assert layer.parent == forks.mem and cut["in_memory"] == 1.0 and cut["files"] == 100
    assert (layer / "d" / "f7").read_bytes() == bytes([7]) * 1000
    assert layer_names(forks.root) == [f"mem/{layer.name}"]
    assert forks.stats()["made_in_memory"] == 1 and forks.stats()["memory_used_bytes"] > 0
    forks.stop()  # a layer is left: the tmpfs stays
    assert is_mounted(forks.mem)
    assert forks.collect([]) == [layer]
    forks.stop()
    assert not is_mounted(forks.mem) and not forks.mem.exists() and layer_names(forks.root) == []


def test_a_layer_larger_than_what_is_free_in_memory_goes_to_disk(store, tmp_path: Path) -> None:
    forks = store(1 << 20)
    _fill(tmp_path / "upper", 4, 512 << 10)  # 2 MiB of changes, a 1 MiB tmpfs
    layer, cut = forks.freeze(Upper(tmp_path / "upper"))
    forks.settle(layer)
    assert layer.parent == forks.root and cut["in_memory"] == 0.0
    assert (layer / "d" / "f3").stat().st_size == 512 << 10
    assert forks.collect([layer]) == [] and forks.collect([]) == [layer]


def test_a_layer_goes_to_disk_when_the_node_memory_is_committed(store, tmp_path: Path) -> None:
    """The tmpfs has room but the provisioner's uncommitted memory (headroom) does not: disk; and
    what a layer in memory holds is what the provisioner counts (memory_used)."""
    forks = store(8 << 20)
    _fill(tmp_path / "upper", 10, 100_000)  # ~1 MB
    forks.headroom = lambda: 512 << 10
    layer, cut = forks.freeze(Upper(tmp_path / "upper"))
    forks.settle(layer)
    assert layer.parent == forks.root and cut["in_memory"] == 0.0 and forks.memory_used() == 0
    forks.headroom = lambda: 64 << 20
    layer2, cut2 = forks.freeze(Upper(tmp_path / "upper"))
    forks.settle(layer2)
    assert layer2.parent == forks.mem and cut2["in_memory"] == 1.0
    assert 1_000_000 <= forks.memory_used() <= 2 << 20
    assert sorted(forks.collect([])) == sorted([layer, layer2]) and forks.memory_used() == 0


def test_changes_that_outgrow_the_tmpfs_after_the_estimate_are_copied_to_disk(store, tmp_path: Path) -> None:
    forks = store(1 << 20)
    upper = tmp_path / "upper"
    _fill(upper, 2, 1000)  # fits when estimated; 3 MiB more are written before the freeze

    def grow() -> None:
        (upper / "late.bin").write_bytes(b"x" * (3 << 20))

    env = Upper(upper, grow)
    layer, cut = forks.freeze(env)
    forks.settle(layer)
    assert env.cuts == 1 and layer.parent == forks.root and cut["in_memory"] == 0.0
    assert (layer / "late.bin").stat().st_size == 3 << 20 and (layer / "d" / "f1").exists()
    assert list(forks.mem.iterdir()) == []  # the half copy in memory is gone


def test_no_tmpfs_when_fork_memory_is_zero_and_a_restarted_store_keeps_the_layers_in_memory(store, tmp_path: Path) -> None:
    off = ForkLayers(tmp_path / "off", 0)
    off.start()
    _fill(tmp_path / "upper", 3, 100)
    layer, _ = off.freeze(Upper(tmp_path / "upper"))
    off.settle(layer)
    assert not (tmp_path / "off" / "mem").exists() and layer.parent == off.root

    first = store(4 << 20)
    kept, _ = first.freeze(Upper(tmp_path / "upper"))
    first.settle(kept)
    again = store(4 << 20)  # the next agent over the same root: the tmpfs and its layer stay
    assert is_mounted(again.mem) and again.collect([kept]) == [] and (kept / "d" / "f2").exists()
    assert again.collect([]) == [kept]
