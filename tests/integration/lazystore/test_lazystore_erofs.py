"""EROFS lowers over the lazy store (format/erofs.py, lazystore/fs.py `/blobs`, lowers/erofs.py): the
image the writer makes from a TOC mounts in the kernel over the daemon's FUSE blob file and
shows exactly the tree the FUSE view shows (types, modes, owners, times, link counts, xattrs,
the opaque marker, whiteouts, contents); an overlay stacks it; and a walk through it sends the
daemon no metadata requests at all."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from components import need
from lazystore_fixtures import build_tree, overlay, publish, walk

from rollstack.format import erofs
from rollstack.format.reader import LayerReader, read_files, read_toc
from rollstack.format.source import FileBlobSource
from rollstack.host.umount import detach
from rollstack.lowers.erofs import ErofsLowers, mount_image, supported

pytestmark = pytest.mark.integration


def _tree(tmp_path: Path) -> Path:
    root = build_tree(tmp_path / "src")
    many = root / "many"  # a directory over one block of dirents: FLAT_PLAIN, several blocks
    many.mkdir()
    for i in range(400):
        (many / f"entry-with-a-longish-name-{i:04d}.txt").write_text(f"{i}\n")
    os.symlink("x" * 3000, root / "long-symlink")  # over INLINE_MAX: a plain data block
    (root / "opaque").mkdir()
    os.setxattr(root / "opaque", "trusted.overlay.opaque", b"y")
    os.mknod(root / "gone", stat.S_IFCHR, 0)  # a whiteout
    (root / "zero-then-data").write_bytes(b"\0" * 5000 + b"end")
    return root


def _same(a: Path, b: Path) -> None:
    for p in walk(a):
        q = b / p.relative_to(a)
        sa, sb = os.lstat(p), os.lstat(q)
        for f in ("st_mode", "st_uid", "st_gid", "st_mtime_ns", "st_nlink", "st_rdev"):
            assert getattr(sa, f) == getattr(sb, f), (p, f)
        assert sorted(os.listxattr(p, follow_symlinks=False)) == sorted(os.listxattr(q, follow_symlinks=False)), p
        for name in os.listxattr(p, follow_symlinks=False):
            assert os.getxattr(p, name, follow_symlinks=False) == os.getxattr(q, name, follow_symlinks=False)
        if stat.S_ISLNK(sa.st_mode):
            assert os.readlink(p) == os.readlink(q)
        elif stat.S_ISREG(sa.st_mode):
            assert sa.st_size == sb.st_size and p.read_bytes() == q.read_bytes(), p
        elif stat.S_ISDIR(sa.st_mode):
            assert sorted(os.listdir(p)) == sorted(os.listdir(q)), p
    assert sum(1 for _ in walk(a)) == sum(1 for _ in walk(b))


def test_the_image_over_the_daemon_blob_is_the_fuse_tree(tmp_path, oci_store, lazy_factory):
    need(supported(), "Linux >= 6.12 with EROFS (file-backed mounts)")
    src = _tree(tmp_path)
    blob = tmp_path / "layer.blob"
    digest = publish(oci_store, src, blob, "test/erofs")
    lazy = lazy_factory(oci_store.url)
    lazy.add_layers([{"repo": "test/erofs", "digest": digest}])
    hexd = digest.partition(":")[2]
    reader = LayerReader(FileBlobSource(blob))
    image, blob_size = erofs.build(reader.toc, digest)
    img = tmp_path / "layer.img"
    img.write_bytes(image)

    fuse_blob = lazy.mountpoint / "blobs" / hexd
    assert fuse_blob.stat().st_size == blob_size
    # the daemon's blob is the files' bytes at the writer's extents, zero padded
    data = fuse_blob.read_bytes()
    for pos, block, size in erofs.blob_extents(reader.toc):
        assert data[block * 4096:block * 4096 + size] == reader.read(reader.toc.entries[pos])
        assert data[block * 4096 + size:-(-(block * 4096 + size) // 4096) * 4096].count(0) == (-size) % 4096
    assert sorted(os.listdir(lazy.mountpoint / "blobs")) == [hexd]

    mnt = tmp_path / "erofs"
    mount_image(img, fuse_blob, mnt)
    try:
        _same(lazy.layer_dir(digest), mnt)
        assert os.getxattr(mnt / "opaque", "trusted.overlay.opaque") == b"y"
        assert stat.S_ISCHR(os.lstat(mnt / "gone").st_mode) and os.lstat(mnt / "gone").st_rdev == 0
        ops0 = dict(lazy.stats()["fuse_ops"])
        with overlay([mnt], tmp_path / "ov") as root:
            assert sorted(os.listdir(root / "many"))[:1] == ["entry-with-a-longish-name-0000.txt"]
            assert not (root / "gone").exists()  # the whiteout, read through the overlay
            names = sum(1 for _ in walk(root))
            assert names > 450
        ops1 = lazy.stats()["fuse_ops"]
        for op in ("lookup", "getattr", "getxattr", "readdir", "readlink"):
            assert ops1.get(op, 0) == ops0.get(op, 0), op  # metadata never reaches the daemon
    finally:
        detach(mnt)


def test_small_files_inline_in_the_image_are_read_without_the_daemon(tmp_path, oci_store, lazy_factory):
    """A published image (plan/groups.publish_images) carries the bytes of the layer's small
    files: the kernel serves them from the image, the tree is the FUSE tree byte for byte, and
    reading them sends the daemon no read; bigger files still come from the blob."""
    need(supported(), "Linux >= 6.12 with EROFS (file-backed mounts)")
    src = _tree(tmp_path)
    (src / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")  # what runc reads at every start
    (src / "exactly-limit").write_bytes(b"x" * erofs.INLINE_FILE_MAX)
    (src / "one-over-limit").write_bytes(b"y" * (erofs.INLINE_FILE_MAX + 1))
    blob = tmp_path / "layer.blob"
    digest = publish(oci_store, src, blob, "test/erofs")
    lazy = lazy_factory(oci_store.url)
    lazy.add_layers([{"repo": "test/erofs", "digest": digest}])
    with FileBlobSource(blob) as source:
        toc = read_toc(source).toc
        inline = read_files(source, toc, erofs.inline_candidates(toc))
    small = {toc.at(p).path for p in inline}
    assert {"etc/passwd", "etc/hostname", "exactly-limit"} <= small
    assert "one-over-limit" not in small and "big.bin" not in small
    image = erofs.build(toc, digest, inline)[0]
    erofs.check_image(image, digest)
    assert len(image) > len(erofs.build(toc, digest)[0])
    img = tmp_path / "layer.img"
    img.write_bytes(image)
    mnt = tmp_path / "erofs"
    mount_image(img, lazy.mountpoint / "blobs" / digest.partition(":")[2], mnt)
    def reads() -> int:
        return sum(n for op, n in lazy.stats()["fuse_ops"].items() if op in ("read", "read_unopened"))

    try:
        reads0 = reads()
        for path in sorted(small):
            assert (mnt / path).read_bytes() == inline[toc.index(path)], path
        assert (mnt / "usr/bin/tool-hardlink").read_text() == "#!/bin/sh\necho tool\n"
        assert reads() == reads0  # none reached the daemon
        assert (mnt / "one-over-limit").read_bytes() == b"y" * (erofs.INLINE_FILE_MAX + 1)
        assert reads() > reads0
        _same(lazy.layer_dir(digest), mnt)
    finally:
        detach(mnt)


def test_the_node_side_builds_and_mounts_once_per_layer(tmp_path, oci_store, lazy_factory):
    need(supported(), "Linux >= 6.12 with EROFS (file-backed mounts)")
    src = _tree(tmp_path)
    digest = publish(oci_store, src, tmp_path / "layer.blob", "test/erofs")
    lazy = lazy_factory(oci_store.url)
    lazy.add_layers([{"repo": "test/erofs", "digest": digest}])
    lowers = ErofsLowers(tmp_path / "erofs", lazy, tmp_path / "node" / "state" / "tocs").start()

    class Ref:
        pass

    ref = Ref()
    ref.digest = digest
    try:
        assert lowers.lower_for(digest) is None
        lowers.used([ref])
        lowers.used([ref])  # queued once
        assert lowers.wait_idle(60)
        path = lowers.lower_for(digest)
        assert path is not None and lowers.failures() == {}
        assert (path / "etc/hostname").read_text() == "rollstack\n"
        assert lowers.stats()["ready"] == 1
    finally:
        lowers.stop()
    assert not any(p.is_dir() and os.path.ismount(p) for p in (tmp_path / "erofs").iterdir())


def test_a_layer_without_a_cached_toc_stays_on_fuse(tmp_path, lazy_factory, oci_store):
    need(supported(), "Linux >= 6.12 with EROFS (file-backed mounts)")
    lazy = lazy_factory(oci_store.url)
    lowers = ErofsLowers(tmp_path / "erofs", lazy, tmp_path / "no-tocs").start()

    class Ref:
        digest = "sha256:" + "ab" * 32

    try:
        lowers.used([Ref()])
        assert lowers.wait_idle(60)
        assert lowers.lower_for(Ref.digest) is None
        assert "not in" in lowers.failures()[Ref.digest]
    finally:
        lowers.stop()
