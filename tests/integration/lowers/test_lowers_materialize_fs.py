"""Materialized layers against the real lazy store: the local copy `cp -a` makes of a layer's
FUSE directory is the same tree (every entry type, metadata, xattrs, overlay markers), overlayfs
over copies merges like overlayfs over FUSE, and a node stacks the copy once a layer is hot."""

from __future__ import annotations

import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from components import require_tool
from rollstack.format.convert import convert
from rollstack.lazystore.client import LazyStoreClient
from rollstack.lazystore.config import DaemonConfig
from rollstack.lowers.materialize import LayerMaterializer

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Ref:
    repo: str
    digest: str


def publish(store, src: Path, blob: Path, repo: str) -> Ref:
    info = convert(src, blob)
    store.put_blob(repo, info.digest, blob)
    return Ref(repo, info.digest)


def lower_tree(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tool").write_bytes(b"#!/bin/sh\necho tool\n")
    os.chmod(root / "bin" / "tool", 0o4755)  # setuid survives
    (root / "data").mkdir(mode=0o700)
    (root / "data" / "big.bin").write_bytes(os.urandom(3 << 20))  # several chunks
    (root / "data" / "empty").write_bytes(b"")
    os.link(root / "data" / "big.bin", root / "data" / "big-link.bin")
    os.symlink("../bin/tool", root / "data" / "rel-link")
    os.symlink("/bin/tool", root / "data" / "abs-link")
    os.chown(root / "data" / "empty", 1234, 4321)
    os.setxattr(root / "bin" / "tool", "user.rollstack", b"attr")
    os.mkfifo(root / "data" / "fifo")
    (root / "hidden").mkdir()
    (root / "hidden" / "old.txt").write_text("lower")
    (root / "gone.txt").write_text("deleted above")
    (root / "emptydir").mkdir()
    os.utime(root / "bin" / "tool", ns=(1_600_000_000_123_456_789, 1_600_000_000_123_456_789))
    return root


def upper_tree(root: Path) -> Path:
    (root / "hidden").mkdir(parents=True)
    os.setxattr(root / "hidden", "trusted.overlay.opaque", b"y")  # opaque: lower contents hidden
    (root / "hidden" / "new.txt").write_text("upper")
    os.mknod(root / "gone.txt", stat.S_IFCHR | 0o000, os.makedev(0, 0))  # whiteout
    (root / "bin").mkdir()
    (root / "bin" / "added").write_text("added above")
    return root


def describe(root: Path) -> dict[str, tuple]:
    """Every entry's type, mode, owner, size, mtime, device, link target, xattrs, content, and
    which entries share an inode (hardlinks)."""
    out: dict[str, tuple] = {}
    inodes: dict[int, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            st = os.lstat(p)
            kind = stat.S_IFMT(st.st_mode)
            xattrs = tuple(sorted((n, os.getxattr(p, n, follow_symlinks=False))
                                  for n in os.listxattr(p, follow_symlinks=False)))
            body = p.read_bytes() if kind == stat.S_IFREG else os.readlink(p) if kind == stat.S_IFLNK else None
            mtime = st.st_mtime_ns if kind != stat.S_IFDIR else None  # cp sets directory times last: compared too
            link = inodes.setdefault(st.st_ino, rel) if kind == stat.S_IFREG and st.st_nlink > 1 else None
            out[rel] = (kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,
                        st.st_size if kind == stat.S_IFREG else None, mtime, st.st_rdev, xattrs, body, link)
    return out


@pytest.fixture
def lazy(tmp_path: Path, oci_store):
    require_tool("fusermount3")
    client = LazyStoreClient.start(DaemonConfig.of(tmp_path / "mnt", tmp_path / "state", oci_store.url))
    try:
        yield client
    finally:
        client.stop()


def materialize(lazy: LazyStoreClient, root: Path, refs: list[Ref]) -> LayerMaterializer:
    m = LayerMaterializer(root, lazy, after=1, grace=0.0, min_free=0).start()
    m.used(refs)
    assert m.wait_idle(120)
    assert m.stats()["failures"] == 0
    return m


def test_the_copy_of_a_layer_is_the_same_tree_as_its_fuse_view(tmp_path, oci_store, lazy):
    low = publish(oci_store, lower_tree(tmp_path / "low"), tmp_path / "low.blob", "test/mat-low")
    up = publish(oci_store, upper_tree(tmp_path / "up"), tmp_path / "up.blob", "test/mat-up")
    lazy.add_layers([low, up])
    m = materialize(lazy, tmp_path / "layers", [low, up])
    try:
        for ref in (low, up):
            local = m.lower_for(ref.digest)
            assert local is not None and local.parent == tmp_path / "layers"
            assert describe(local) == describe(lazy.layer_dir(ref.digest))
        copy = describe(m.lower_for(up.digest))
        assert copy["hidden"][7] == (("trusted.overlay.opaque", b"y"),)  # the overlay markers survive
        assert copy["gone.txt"][0] == stat.S_IFCHR and copy["gone.txt"][6] == 0
        low_copy = describe(m.lower_for(low.digest))
        assert low_copy["data/big-link.bin"][9] == low_copy["data/big.bin"][9]  # still one inode
    finally:
        m.stop()


def test_overlayfs_merges_copies_like_fuse_directories(tmp_path, oci_store, lazy):
    low = publish(oci_store, lower_tree(tmp_path / "low"), tmp_path / "low.blob", "test/mat-low")
    up = publish(oci_store, upper_tree(tmp_path / "up"), tmp_path / "up.blob", "test/mat-up")
    lazy.add_layers([low, up])
    m = materialize(lazy, tmp_path / "layers", [low, up])
    views = {}
    try:
        for name, lowers in (("fuse", [lazy.layer_dir(up.digest), lazy.layer_dir(low.digest)]),
                             ("local", [m.lower_for(up.digest), m.lower_for(low.digest)])):
            d = tmp_path / f"ov-{name}"
            for sub in ("upper", "work", "merged"):
                (d / sub).mkdir(parents=True)
            opts = f"lowerdir={':'.join(map(str, lowers))},upperdir={d / 'upper'},workdir={d / 'work'}"
            subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(d / "merged")], check=True)
            try:
                merged = d / "merged"
                views[name] = {k: (v[0], v[1], v[8]) for k, v in describe(merged).items()}
                assert not (merged / "gone.txt").exists() and not (merged / "hidden" / "old.txt").exists()
                (merged / "data" / "big.bin").write_bytes(b"copied up")  # writes land in the upper only
            finally:
                subprocess.run(["umount", str(d / "merged")], check=True)
    finally:
        m.stop()
    assert views["fuse"] == views["local"]
    assert len((m.lower_for(low.digest) / "data" / "big.bin").read_bytes()) == 3 << 20


def test_a_node_stacks_the_local_copy_once_the_layer_is_hot(tmp_path):
    from node_helpers import plan, publish_corpus
    from rollstack.node.config import NodeConfig
    from rollstack.node.service import NodeService

    require_tool("runc", "fusermount3")
    store = publish_corpus(tmp_path / "store", tmp_path / "build")
    root = tmp_path / "node"
    service = NodeService(NodeConfig(root=root, store=store, reap_interval=0.5,
                                     lowers={"materialize_after": 1, "materialize_min_free": 0}))
    service.start()
    try:
        first = service.create(plan())
        service.destroy(first.id)
        assert service.stages.lowers.materializer.wait_idle(120)
        assert service.stages.lowers.materializer.stats()["layers"] >= 1
        second = service.create(plan())
        with open("/proc/self/mountinfo") as f:
            overlay = [line for line in f if f"envs/{second.id}" in line and " overlay " in line]
        # user-namespaced (the default): the overlay stacks idmapped clones of the lowers, so the
        # environment's recorded lowers say what was stacked
        import json

        lowers = json.loads((root / "envs" / second.id / "meta.json").read_text())["lowers"]
        assert overlay and any(p.startswith(str(root / "layers")) for p in lowers), lowers
        from rollstack.contract.models import ExecRequest

        res = service.exec(second.id, ExecRequest(argv=["/bin/busybox", "ls", "/"]))
        assert res.exit_code == 0 and "bin" in res.stdout
        service.destroy(second.id)
    finally:
        service.stop()
