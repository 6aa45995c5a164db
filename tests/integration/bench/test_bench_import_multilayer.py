"""A multi-layer Docker-style image (5 gzip layers: whiteouts of a file and of a directory, an
opaque directory, hardlinks, a file replaced in a later layer) imported with `group import`
shows exactly the tree containerd shows for the same image: the same command (a listing with
link counts, sizes and checksums) prints the same bytes in a rollstack environment and in a
`ctr run` container, over the bench rig's real registry and containerd."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest

from oci_image_helpers import write_oci_image
from components import need, require_root
from rollstack_bench.systems.containerd import available

pytestmark = pytest.mark.integration

LIST = ("cd /data && /bin/busybox find . | /bin/busybox sort | while read p; do "
        "if [ -L \"$p\" ]; then echo \"L $p\"; elif [ -d \"$p\" ]; then echo \"D $p\"; "
        "else echo \"F $p $(/bin/busybox stat -c %h:%s \"$p\") $(/bin/busybox md5sum < \"$p\")\"; fi; done")


def _tar_layer(build) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        build(tar)
    return gzip.compress(buf.getvalue(), mtime=0)


def _file(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime, ti.mode = len(data), 1_700_000_000, 0o644
    tar.addfile(ti, io.BytesIO(data))


def _dir(tar: tarfile.TarFile, name: str) -> None:
    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, 1_700_000_000
    tar.addfile(ti)


def _link(tar: tarfile.TarFile, name: str, target: str) -> None:
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname, ti.mtime = tarfile.LNKTYPE, target, 1_700_000_000
    tar.addfile(ti)


def _image(path: Path, base: Path) -> Path:
    def l0(tar):
        tar.add(str(base), arcname=".", recursive=True)

    def l1(tar):
        _dir(tar, "data"); _dir(tar, "data/keep"); _dir(tar, "data/gone-dir"); _dir(tar, "data/opq")
        _file(tar, "data/keep/a.txt", b"a1\n"); _link(tar, "data/keep/a-link", "data/keep/a.txt")
        _file(tar, "data/gone.txt", b"gone\n"); _file(tar, "data/gone-dir/x", b"x\n")
        _file(tar, "data/opq/old1", b"old1\n"); _file(tar, "data/opq/old2", b"old2\n")

    def l2(tar):  # whiteout of a file, replaced file
        _dir(tar, "data"); _dir(tar, "data/keep")
        _file(tar, "data/.wh.gone.txt", b""); _file(tar, "data/keep/b.txt", b"b2\n")

    def l3(tar):  # opaque directory
        _dir(tar, "data"); _dir(tar, "data/opq")
        _file(tar, "data/opq/.wh..wh..opq", b""); _file(tar, "data/opq/new", b"new\n")

    def l4(tar):  # a new hardlink group, a file replaced
        _dir(tar, "data"); _dir(tar, "data/keep")
        _file(tar, "data/keep/b.txt", b"b4 replaced\n")
        _file(tar, "data/h1", b"h" * 5000); _link(tar, "data/h2", "data/h1"); _link(tar, "data/h3", "data/h1")

    def l5(tar):  # whiteout of a whole directory
        _dir(tar, "data")
        _file(tar, "data/.wh.gone-dir", b"")

    return write_oci_image(path, [_tar_layer(build) for build in (l0, l1, l2, l3, l4, l5)], "t")


def test_a_multilayer_image_runs_identically_to_containerd(tmp_path: Path) -> None:
    require_root()  # a failure in CI, a skip elsewhere
    need(available() is None, f"containerd for the comparison ({available()})")
    from rollstack_bench.systems.rig import BenchRig
    from rollstack_bench.systems.oci import push
    from rollstack_bench.env import build_busybox_trees
    from rollstack_bench.systems.rollstack import RollstackSystem
    from rollstack.plan.imports import import_image
    from rollstack.store import open_store

    base = build_busybox_trees(tmp_path / "trees")["os"]
    (base / "bin" / "find").symlink_to("busybox")
    image = _image(tmp_path / "img", base)
    with BenchRig(Path("/var/cache/rollstack/bench-import-multilayer-test"), "lan") as rig:
        res = import_image(f"oci:{image}:t", "test/multilayer:1", open_store(rig.registry.url), cache_dir=tmp_path / "c")
        assert res.converted == 6
        push(image, "t", rig.registry.address, "img/multilayer")
        ref = f"{rig.registry.address}/img/multilayer:t"
        rig.ctr.pull(ref)
        cid = f"rsml-{os.getpid()}"
        rig.ctr.create(ref, cid, ["/bin/sh", "-c", LIST])
        try:
            ctd = rig.ctr.start(cid)
        finally:
            rig.ctr.delete(cid)
            rig.ctr.clear()
        system = RollstackSystem("rollstack", rig.registry.url, tmp_path / "node", rig.link, lowers={"materialize_after": 0})
        try:
            system.start()
            with system.node.create({"name": "ml", "groups": ["test/multilayer:1"], "workdir": "/"}) as env:
                ours = env.exec(["/bin/sh", "-c", LIST])
        finally:
            system.stop()
    assert ctd.returncode == 0 and ours.exit_code == 0, (ctd.stderr, ours.stderr)
    assert ours.stdout == ctd.stdout
    lines = ctd.stdout.splitlines()
    assert "F ./h1 3:5000" in " ".join(lines) and not any("gone" in x for x in lines)
    assert not any("old1" in x for x in lines) and any("./opq/new" in x for x in lines)
    assert any(x.startswith("F ./keep/a-link 2:3") for x in lines) and any("./keep/b.txt 1:12" in x for x in lines)
