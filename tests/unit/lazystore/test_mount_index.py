"""LayerIndex: stable inodes, lookups, children, hardlinks, overlay-format attributes."""

from __future__ import annotations

import stat

from rollstack.format import toc_codec
from rollstack.format.toc import EntryType, Toc, TocEntry
from rollstack.lazystore.envs import env_id_from_cgroup
from rollstack.lazystore.index import LayerIndex, entry_size, mode_bits, rdev

D = "sha256:" + "cd" * 32


def toc(with_root: bool = True) -> Toc:
    es = [
        TocEntry("a", EntryType.DIR, mode=0o755),
        TocEntry("a/x", EntryType.REG, size=3),
        TocEntry("a/y", EntryType.HARDLINK, link="a/x"),
        TocEntry("a.b", EntryType.REG),  # sorts between "a" and "a/..." prefixes: must not be a child of a
        TocEntry("a/sub", EntryType.DIR, opaque=True),
        TocEntry("a/sub/z", EntryType.SYMLINK, link="../x"),
        TocEntry("gone", EntryType.WHITEOUT),
        TocEntry("dev", EntryType.CHAR, rdev_major=1, rdev_minor=3, mode=0o666),
    ]
    if with_root:
        es.append(TocEntry("", EntryType.DIR, mode=0o755))
    return Toc(es)


def test_lookup_children_and_parents():
    for with_root in (True, False):
        idx = LayerIndex(D, toc(with_root), base=5000)
        a = idx.child(idx.root, "a")
        assert a is not None and idx.path(a) == "a"
        assert [n for n, _ in idx.children(idx.root)] == ["a", "a.b", "dev", "gone"]
        assert [n for n, _ in idx.children(a)] == ["sub", "x", "y"]
        assert idx.child(a, "nope") is None
        sub = idx.child(a, "sub")
        assert idx.parent(sub) == a and idx.parent(a) == idx.root
        assert all(idx.owns(i) for _, i in idx.children(a))
        assert not idx.owns(idx.base + idx.size)


def test_hardlinks_share_the_target_inode_and_count_links():
    idx = LayerIndex(D, toc(), base=100)
    a = idx.child(idx.root, "a")
    x, y = idx.child(a, "x"), idx.child(a, "y")
    assert x == y
    assert idx.nlink(x) == 1 and not idx.hardlinks_ready  # never computed on the FUSE loop
    idx.hardlinks()
    assert idx.nlink(x) == 2
    assert idx.nlink(a) == 3  # ., .., sub


def test_overlay_format_attributes():
    idx = LayerIndex(D, toc(), base=100)
    wh = idx.entry(idx.child(idx.root, "gone"))
    assert stat.S_ISCHR(mode_bits(wh)) and rdev(wh) == 0
    dev = idx.entry(idx.child(idx.root, "dev"))
    assert stat.S_ISCHR(mode_bits(dev)) and rdev(dev) != 0
    link = idx.entry(idx.child(idx.child(idx.root, "a"), "sub"))
    assert link.opaque
    assert entry_size(TocEntry("l", EntryType.SYMLINK, link="../x")) == 4


def test_env_id_from_cgroup():
    v1 = "12:pids:/rollstack/env-1\n4:memory:/rollstack/env-1\n0::/\n"
    assert env_id_from_cgroup(v1) == "env-1"
    assert env_id_from_cgroup("0::/system.slice/rollstack/abc.def\n") == "abc.def"
    assert env_id_from_cgroup("0::/user.slice\n4:memory:/process_api/x\n") is None
    assert env_id_from_cgroup("0::/notrollstack/x\n") is None


def test_chunks_after_walks_blob_order_lazily():
    from rollstack.format.toc import Chunk

    def c(bo: int, off: int = 0) -> Chunk:
        return Chunk(offset=off, size=10, blob_offset=bo, blob_size=10, digest=f"sha256:{bo:064x}")

    t = Toc([TocEntry("", EntryType.DIR), TocEntry("a", EntryType.REG, size=20, chunks=[c(0), c(10, 10)]),
             TocEntry("b", EntryType.REG, size=10, chunks=[c(20)]), TocEntry("c", EntryType.DIR)])
    idx = LayerIndex(D, t, base=10)
    a = idx.child(idx.root, "a")
    assert [x.blob_offset for x in idx.chunks_after(a, 0)] == [10, 20]
    assert [x.blob_offset for x in idx.chunks_after(a, 10)] == [20]


def test_chunks_before_walks_backwards():
    from rollstack.format.toc import Chunk

    def c(bo: int) -> Chunk:
        return Chunk(offset=0, size=10, blob_offset=bo, blob_size=10, digest=f"sha256:{bo:064x}")

    t = Toc([TocEntry("", EntryType.DIR), TocEntry("a", EntryType.REG, size=10, chunks=[c(0)]),
             TocEntry("b", EntryType.REG, size=10, chunks=[c(10)]), TocEntry("c", EntryType.REG, size=10, chunks=[c(20)])])
    idx = LayerIndex(D, t, base=10)
    assert [x.blob_offset for x in idx.chunks_before(idx.child(idx.root, "c"))] == [10, 0]


def test_neighbour_walks_can_stay_in_the_parent_directory_subtree():
    from rollstack.format.toc import Chunk

    def c(bo: int) -> Chunk:
        return Chunk(offset=0, size=10, blob_offset=bo, blob_size=10, digest=f"sha256:{bo:064x}")

    names = ["p.txt", "pkg/a.py", "pkg/b.py", "pkg/sub/c.py", "pkg0/d.py"]
    es = [TocEntry("", EntryType.DIR), TocEntry("pkg", EntryType.DIR), TocEntry("pkg/sub", EntryType.DIR),
          TocEntry("pkg0", EntryType.DIR)]
    es += [TocEntry(n, EntryType.REG, size=10, chunks=[c(10 * i)]) for i, n in enumerate(names)]
    idx = LayerIndex(D, Toc(es), base=10)
    b = idx.find("pkg/b.py")
    assert [x.blob_offset for x in idx.chunks_after(b, 0)] == [30, 40]  # crosses into pkg0/
    assert [x.blob_offset for x in idx.chunks_after(b, 0, same_dir=True)] == [30]  # pkg/ subtree only
    assert [x.blob_offset for x in idx.chunks_before(b)] == [10, 0]
    assert [x.blob_offset for x in idx.chunks_before(b, same_dir=True)] == [10]
    top = idx.find("p.txt")  # at the root: no parent directory to stay in, the whole blob is fair
    assert [x.blob_offset for x in idx.chunks_after(top, 0, same_dir=True)] == [10, 20, 30, 40]


def test_sibling_chunks_are_the_small_regular_files_of_the_same_directory():
    from rollstack.format.toc import Chunk

    def reg(path: str, stored: int, at: int) -> TocEntry:
        c = Chunk(offset=0, size=stored, blob_offset=at, blob_size=stored, digest=f"sha256:{at:064x}")
        return TocEntry(path, EntryType.REG, size=stored, chunks=[c])

    es = [TocEntry("", EntryType.DIR), TocEntry("p", EntryType.DIR), reg("p/a.pyc", 10, 0),
          TocEntry("p/sub", EntryType.DIR), reg("p/sub/deep.pyc", 10, 10), reg("p/b.pyc", 10, 20),
          reg("p/big.so", 5000, 30), TocEntry("p/link", EntryType.SYMLINK, link="a.pyc"), reg("p.txt", 10, 5030),
          reg("q", 10, 5040)]
    idx = LayerIndex(D, Toc(es), base=100)
    a = idx.find("p/a.pyc")
    assert [c.blob_offset for c in idx.sibling_chunks(a, file_max=100)] == [20]  # b.pyc: not itself, not deeper, not big
    assert [c.blob_offset for c in idx.sibling_chunks(a, file_max=10_000)] == [20, 30]
    assert [c.blob_offset for c in idx.sibling_chunks(idx.find("q"), file_max=100)] == [5030]  # top level


def test_xattr_inodes_are_known_before_the_hardlink_scan_and_name_exactly_the_entries_with_xattrs():
    for with_root in (True, False):
        t = toc(with_root)
        t.lookup("a/x").xattrs["user.k"] = b"v"
        idx = LayerIndex(D, t, base=7000)
        assert not idx.hardlinks_ready  # the xattr set does not wait for the (delayed) hardlink scan
        a = idx.child(idx.root, "a")
        x, sub = idx.child(a, "x"), idx.child(a, "sub")
        assert idx.xattr_inodes == frozenset({x, sub})  # the xattr, and the opaque directory
        assert idx.child(a, "y") == x  # the hardlink resolves to the inode that has the xattr
        assert all(idx.owns(i) for i in idx.xattr_inodes)
        decoded = LayerIndex(D, toc_codec.decode_raw(toc_codec.encode_raw(t.entries)), base=7000)
        assert decoded.xattr_inodes == idx.xattr_inodes  # from the record column, no entry built
