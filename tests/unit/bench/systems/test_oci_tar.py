"""Layer tars from directory trees: OCI whiteouts, links, deterministic order, image layout."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
from pathlib import Path

from components import require_root

from rollstack_bench.systems.oci import build_layer, write_image, write_tar


def _tree(root: Path) -> None:
    (root / "b" / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("alpha")
    (root / "b" / "sub" / "c.txt").write_text("gamma")
    (root / "link").symlink_to("a.txt")
    os.link(root / "a.txt", root / "b" / "hard.txt")


def _names(data: bytes) -> list[tuple[str, str]]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        kinds = {tarfile.REGTYPE: "reg", tarfile.DIRTYPE: "dir", tarfile.SYMTYPE: "sym", tarfile.LNKTYPE: "hard"}
        return [(m.name, kinds.get(m.type, str(m.type))) for m in tar.getmembers()]


def test_tar_order_and_links(tmp_path: Path) -> None:
    _tree(tmp_path / "t")
    buf = io.BytesIO()
    write_tar(tmp_path / "t", buf)
    names = _names(buf.getvalue())
    assert [n for n, _ in names] == ["a.txt", "b", "b/hard.txt", "b/sub", "b/sub/c.txt", "link"]
    assert dict(names)["b/hard.txt"] == "hard" and dict(names)["link"] == "sym"
    again = io.BytesIO()
    write_tar(tmp_path / "t", again)
    assert again.getvalue() == buf.getvalue()  # reproducible


def test_overlay_whiteouts_become_oci_whiteouts(tmp_path: Path) -> None:
    require_root()  # mknod of a 0/0 character device and trusted.* xattrs
    root = tmp_path / "t"
    (root / "etc").mkdir(parents=True)
    os.mknod(root / "etc" / "gone.conf", 0o600 | stat.S_IFCHR, os.makedev(0, 0))
    (root / "opaque").mkdir()
    os.setxattr(root / "opaque", "trusted.overlay.opaque", b"y")
    buf = io.BytesIO()
    write_tar(root, buf)
    names = [n for n, _ in _names(buf.getvalue())]
    assert "etc/.wh.gone.conf" in names and "etc/gone.conf" not in names
    assert "opaque/.wh..wh..opq" in names


def test_build_layer_caches_and_image_layout(tmp_path: Path) -> None:
    _tree(tmp_path / "t")
    blob = build_layer(tmp_path / "t", tmp_path / "blobs", "k1", tmp_path / "meta")
    assert blob.digest.startswith("sha256:") and blob.size == Path(blob.path).stat().st_size
    assert build_layer(tmp_path / "t", tmp_path / "blobs", "k1", tmp_path / "meta") == blob  # cached
    layout = tmp_path / "layout"
    from rollstack_bench.systems.oci import link_blob

    link_blob(layout, blob)
    mdig = write_image(layout, "v1", [blob], workdir="/work/x")
    index = json.loads((layout / "index.json").read_text())
    assert [m["digest"] for m in index["manifests"]] == [mdig]
    manifest = json.loads((layout / "blobs" / "sha256" / mdig.split(":")[1]).read_bytes())
    assert manifest["layers"][0]["digest"] == blob.digest
    config = json.loads((layout / "blobs" / "sha256" / manifest["config"]["digest"].split(":")[1]).read_bytes())
    assert config["rootfs"]["diff_ids"] == [blob.diff_id] and config["config"]["WorkingDir"] == "/work/x"
    write_image(layout, "v1", [blob], workdir="/other")  # re-tagging replaces, never duplicates
    assert len(json.loads((layout / "index.json").read_text())["manifests"]) == 1
