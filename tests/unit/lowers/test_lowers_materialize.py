"""LayerMaterializer's bookkeeping with a fake lazy store and copier: when a layer is copied,
what happens on failure, and which copies the byte budget removes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rollstack.lowers.materialize import LayerMaterializer


@dataclass(frozen=True)
class Ref:
    digest: str


def ref(n: int) -> Ref:
    return Ref("sha256:" + f"{n:02x}" * 32)


class FakeLazy:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.fetched: list[str] = []

    def fetch_all(self, refs, background=False):
        assert background  # materializing must never compete with demand reads
        self.fetched += [r.digest for r in refs]

    def layer_dir(self, digest: str) -> Path:
        return self.root / digest.partition(":")[2]


def make(tmp_path: Path, **kw):
    copies: list[tuple[Path, Path]] = []
    fail: set[str] = set()

    def copier(src: Path, dst: Path) -> None:
        copies.append((src, dst))
        if src.name in fail:
            raise OSError("disk full")
        dst.mkdir(parents=True)
        (dst / "payload").write_bytes(b"x" * 10_000)

    lazy = FakeLazy(tmp_path / "fuse")
    m = LayerMaterializer(tmp_path / "layers", lazy, copier=copier, grace=0.0, **kw).start()
    return m, lazy, copies, fail


def test_a_layer_is_copied_once_it_is_hot(tmp_path):
    m, lazy, copies, _ = make(tmp_path, after=2)
    try:
        a = ref(1)
        m.used([a])
        assert m.wait_idle(5) and m.lower_for(a.digest) is None and copies == []
        m.used([a])
        assert m.wait_idle(5)
        local = m.lower_for(a.digest)
        assert local == tmp_path / "layers" / a.digest.partition(":")[2]
        assert (local / "payload").exists() and not list((tmp_path / "layers").glob("*.tmp"))
        assert int((tmp_path / "layers" / (local.name + ".bytes")).read_text()) == m.stats()["bytes"] > 0
        assert lazy.fetched == [a.digest] and copies[0][0] == lazy.layer_dir(a.digest)
        m.used([a])  # already local: nothing more
        assert m.wait_idle(5) and len(copies) == 1
    finally:
        m.stop()


def test_a_ready_copy_is_announced_after_it_is_the_layers_lower(tmp_path):
    """`on_ready` (the node relowers its warm pool there) runs once per copy, when `lower_for`
    already answers with it; a failing hook does not fail the layer."""
    seen: list[Path | None] = []
    m, _lazy, _copies, _ = make(tmp_path, after=1)
    a = ref(1)

    def hook() -> None:
        seen.append(m.lower_for(a.digest))
        raise RuntimeError("a broken hook")

    m.on_ready = hook
    try:
        m.used([a])
        assert m.wait_idle(5)
        assert seen == [tmp_path / "layers" / a.digest.partition(":")[2]]
        assert m.lower_for(a.digest) == seen[0] and m.stats()["failures"] == 0
    finally:
        m.stop()


def test_a_failed_copy_leaves_nothing_and_is_retried_later(tmp_path):
    m, _, copies, fail = make(tmp_path, after=1, retry_after=3600)
    try:
        a = ref(2)
        fail.add(a.digest.partition(":")[2])
        m.used([a])
        assert m.wait_idle(5)
        assert m.lower_for(a.digest) is None and m.stats()["failures"] == 1
        assert not list((tmp_path / "layers").iterdir())
        m.used([a])  # within retry_after: not tried again
        assert m.wait_idle(5) and len(copies) == 1
    finally:
        m.stop()


def test_the_budget_removes_least_recently_used_unmounted_copies(tmp_path):
    mounted: list[str] = []
    m, _, _, _ = make(tmp_path, after=1, budget=30_000, in_use=lambda: " ".join(mounted))
    try:
        a, b, c = ref(3), ref(4), ref(5)
        for r in (a, b):
            m.used([r])
            assert m.wait_idle(5)
        mounted.append(str(tmp_path / "layers" / a.digest.partition(":")[2]))  # a: the LRU one, but mounted
        m.used([c])  # 3 copies of ~12 KiB on disk > 30 KB: the LRU unmounted one (b) goes
        assert m.wait_idle(5)
        assert m.lower_for(a.digest) is not None and m.lower_for(c.digest) is not None
        assert m.lower_for(b.digest) is None and m.stats()["evicted"] == 1
        assert not (tmp_path / "layers" / b.digest.partition(":")[2]).exists()
        assert not (tmp_path / "layers" / (b.digest.partition(":")[2] + ".bytes")).exists()
    finally:
        m.stop()


def test_restart_keeps_complete_copies_and_drops_interrupted_ones(tmp_path):
    root = tmp_path / "layers"
    done, partial = root / ("ab" * 32), root / (("cd" * 32) + ".tmp")
    done.mkdir(parents=True)
    (done / "f").write_bytes(b"1")
    partial.mkdir()
    (root / (("ab" * 32) + ".bytes")).write_text("12345")  # recorded when the copy was made
    orphan = root / (("ef" * 32) + ".bytes")  # the size of a copy that is gone
    orphan.write_text("7")
    m = LayerMaterializer(root, FakeLazy(tmp_path), copier=lambda s, d: None).start()
    try:
        assert m.lower_for("sha256:" + "ab" * 32) == done
        assert not partial.exists() and not orphan.exists()
        assert m.stats()["bytes"] == 12345  # read back, not walked
    finally:
        m.stop()


def test_a_full_disk_is_never_filled_with_copies(tmp_path):
    copies: list = []
    lazy = FakeLazy(tmp_path / "fuse")
    m = LayerMaterializer(tmp_path / "layers", lazy, after=1, grace=0.0, min_free=1 << 30,
                          disk_free=lambda p: 100 << 20, copier=lambda s, d: copies.append(s)).start()
    try:
        m.used([ref(9)])
        assert m.wait_idle(5)
        assert copies == [] and lazy.fetched == [] and m.stats()["skipped_no_space"] == 1
        assert m.lower_for(ref(9).digest) is None
    finally:
        m.stop()


def test_a_copy_is_written_back_before_it_is_published(tmp_path, monkeypatch):
    """A restart reuses copies: the data reaches the disk (syncfs) before the rename makes the
    directory a layer, then the rename itself."""
    import rollstack.lowers.materialize as materialize

    seen: list[tuple[str, bool, bool]] = []

    def syncfs(path) -> None:
        final = tmp_path / "layers" / ref(3).digest.partition(":")[2]
        seen.append((Path(path).name, (final.parent / (final.name + ".tmp") / "payload").exists(), final.exists()))

    monkeypatch.setattr(materialize, "syncfs", syncfs)
    m, _, _, _ = make(tmp_path, after=1)
    try:
        m.used([ref(3)])
        assert m.wait_idle(5) and m.lower_for(ref(3).digest) is not None
    finally:
        m.stop()
    hexd = ref(3).digest.partition(":")[2]
    assert seen == [(f"{hexd}.tmp", True, False), ("layers", False, True)]
