"""A multi-layer Docker-style image imports to exactly the tree containerd-style unpacking gives.

The image (7 gzip tar layers in an OCI layout, written here) uses what real Dockerfiles
produce: whiteouts, opaque directories, deleted-then-recreated directories, hardlinks inside a
layer and to files only a lower layer has, symlinks (absolute, relative, dangling), setuid and
odd modes, owners, user xattrs, a fifo, a file replaced by a directory and a directory by a
symlink. Reference: `umoci unpack` (the OCI reference unpacker; it applies layers like
containerd's differ, linking hardlinks in the unpacked tree). Ours: `group import` into an OCI
store, the layers mounted by the real lazy store (FUSE) and stacked by the kernel's overlayfs.
Compared: every path, type, mode, owner, size, content, link target, xattr, mtime (not of
directories: unpacking changes those) and which names share an inode.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import stat
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

from format_tar_helpers import tar_bytes
from oci_image_helpers import write_oci_image
from rollstack.lazystore.client import LazyStoreClient
from rollstack.lazystore.config import DaemonConfig
from rollstack.plan.imports import import_image
from rollstack.run.overlay import mount_overlay, unmount

pytestmark = pytest.mark.integration

T0 = 1_700_000_000


def _ti(name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, uid: int = 0, gid: int = 0,
        link: str = "", xattrs: dict[str, str] | None = None, mtime: int = T0) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.uid, ti.gid, ti.linkname, ti.mtime = kind, mode, uid, gid, link, mtime
    if xattrs:
        ti.pax_headers = {f"SCHILY.xattr.{k}": v for k, v in xattrs.items()}
    return ti


def D(name: str, mode: int = 0o755, **kw) -> tuple:  # noqa: N802
    return (_ti(name, tarfile.DIRTYPE, mode, **kw), None)


def F(name: str, data: bytes, mode: int = 0o644, **kw) -> tuple:  # noqa: N802
    return (_ti(name, tarfile.REGTYPE, mode, **kw), data)


def L(name: str, target: str, **kw) -> tuple:  # noqa: N802  (symlink)
    return (_ti(name, tarfile.SYMTYPE, 0o777, link=target, **kw), None)


def H(name: str, target: str, **kw) -> tuple:  # noqa: N802  (hardlink)
    return (_ti(name, tarfile.LNKTYPE, 0o644, link=target, **kw), None)


LAYERS = [
    [  # 1: a base system
        D("etc"), F("etc/passwd", b"root:x:0:0::/root:/bin/sh\n"), F("etc/old", b"old\n"),
        F("etc/shadow", b"secret\n", 0o640, gid=42),
        D("usr"), D("usr/bin"), F("usr/bin/tool", b"#!/bin/sh\necho v1\n" * 100, 0o755),
        F("usr/bin/su", b"\x7fELF-ish" * 64, 0o4755), H("usr/bin/tool-again", "usr/bin/tool"),
        D("usr/lib"), F("usr/lib/libx.so.1", os.urandom(300_000), 0o644), L("usr/lib/libx.so", "libx.so.1"),
        D("var"), D("var/cache"), F("var/cache/a", b"a"), D("var/cache/sub"), F("var/cache/sub/b", b"b"),
        D("opt"), D("opt/app"), F("opt/app/main.py", b"print('hi')\n"), D("opt/app/pkg"), F("opt/app/pkg/x", b"x"),
        F("data", b"a file that becomes a directory\n"), D("lib"), F("lib/ld.so", b"loader"),
        D("srv"), F("srv/keep-not", b"gone in layer 6\n"),
        D("home"), D("home/user", 0o700, uid=1000, gid=1000), F("home/user/.profile", b"PS1='$ '\n", 0o600, uid=1000, gid=1000),
        (_ti("run/fifo", tarfile.FIFOTYPE, 0o600), None),
        F("etc/labelled", b"x", xattrs={"user.label": "base", "user.other": "1"}),
    ],
    [  # 2: delete a file, change one, hardlink to a file only layer 1 has
        F("etc/.wh.old", b""), F("usr/bin/tool", b"#!/bin/sh\necho v2\n", 0o750, gid=10),
        H("usr/lib/libx-copy.so.1", "usr/lib/libx.so.1"),
    ],
    [  # 3: an opaque directory (RUN rm -rf var/cache/* && ...)
        D("var/cache"), F("var/cache/.wh..wh..opq", b""), F("var/cache/new", b"fresh\n"),
    ],
    [  # 4: a directory deleted, another created
        F("opt/.wh.app", b""), D("opt/app2"), F("opt/app2/run", b"run\n", 0o755),
        L("opt/current", "/opt/app2/run"), L("opt/dangling", "../nowhere"),
    ],
    [  # 5: a file replaced by a directory, a directory by a symlink
        F(".wh.data", b""), D("data"), F("data/inside", b"now a dir\n"),
        F(".wh.lib", b""), L("lib", "usr/lib"),
    ],
    [  # 6: deleted then recreated in the same layer; a hardlink to a file a lower layer changed
        F(".wh.srv", b""), D("srv", 0o750), F("srv/new", b"new\n"),
        H("usr/bin/tool-v2", "usr/bin/tool"),
    ],
    [  # 7: xattrs changed, owner change, a big sparse-ish file, whiteout of a hardlinked name
        F("etc/labelled", b"y", xattrs={"user.label": "top"}), F("usr/bin/.wh.tool-again", b""),
        F("home/user/big", b"\0" * (3 << 20) + b"tail", 0o644, uid=1000, gid=1000),
    ],
]


def build_layout(root: Path, tag: str = "multi", layers_spec: list[list[tuple]] | None = None) -> Path:
    return write_oci_image(root, [gzip.compress(tar_bytes(members), 6, mtime=0) for members in layers_spec or LAYERS],
                           tag)


def tree(root: Path) -> dict[str, tuple]:
    """path -> (type, mode, uid, gid, size, content digest / link target, xattrs, mtime, inode group)."""
    out: dict[str, tuple] = {}
    inodes: dict[int, list[str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            rel = str(full.relative_to(root))
            st = os.lstat(full)
            kind = stat.S_IFMT(st.st_mode)
            if stat.S_ISREG(kind):
                what = hashlib.sha256(full.read_bytes()).hexdigest()
                inodes.setdefault(st.st_ino, []).append(rel)
            elif stat.S_ISLNK(kind):
                what = os.readlink(full)
            else:
                what = ""
            try:
                xattrs = {k: os.getxattr(full, k, follow_symlinks=False)
                          for k in sorted(os.listxattr(full, follow_symlinks=False)) if k.startswith("user.")}
            except OSError:
                xattrs = {}
            out[rel] = (stat.filemode(st.st_mode), st.st_uid, st.st_gid, st.st_size if not stat.S_ISDIR(kind) else 0,
                        what, xattrs, None if stat.S_ISDIR(kind) else st.st_mtime_ns)
    groups = {p: tuple(sorted(g)) for g in inodes.values() for p in g}
    return {p: (*v, groups.get(p, ())) for p, v in out.items()}


def umoci_rootfs(layout: Path, tag: str, bundle: Path) -> Path:
    subprocess.run(["umoci", "unpack", "--image", f"{layout}:{tag}", str(bundle)], check=True, capture_output=True)
    return bundle / "rootfs"


def test_multilayer_import_matches_umoci_unpack(tmp_path: Path, oci_store):
    layout = build_layout(tmp_path / "image")
    want = tree(umoci_rootfs(layout, "multi", tmp_path / "bundle"))
    # the reference really exercises what we claim
    assert "etc/old" not in want and "var/cache/a" not in want and "var/cache/new" in want
    assert "opt/app" not in want and want["lib"][0].startswith("l") and want["data"][0].startswith("d")
    assert want["usr/lib/libx-copy.so.1"][-1] == ("usr/lib/libx-copy.so.1", "usr/lib/libx.so.1")
    assert want["usr/bin/tool-v2"][-1] == ("usr/bin/tool", "usr/bin/tool-v2")

    name = f"os/multi-{uuid.uuid4().hex[:8]}"
    result = import_image(f"oci:{layout}:multi", f"{name}:1", oci_store, cache_dir=tmp_path / "cache")
    assert result.converted == len(LAYERS) and len(result.layers) == len(LAYERS)

    lazy = LazyStoreClient.start(DaemonConfig.of(tmp_path / "lazy/mnt", tmp_path / "lazy/state", oci_store.url))
    merged = tmp_path / "merged"
    mounted = False
    try:
        refs = [{"repo": name, "digest": layer["digest"]} for layer in result.layers]
        lazy.add_layers(refs)
        lowers = [lazy.layer_dir(layer["digest"]) for layer in reversed(result.layers)]
        for d in ("upper", "work", "merged"):
            (tmp_path / d).mkdir()
        mount_overlay(lowers, tmp_path / "upper", tmp_path / "work", merged)
        mounted = True
        got = tree(merged)
    finally:
        if mounted:
            unmount(merged)
        lazy.stop()
    assert sorted(got) == sorted(want)
    diffs = {p: (got[p], want[p]) for p in want if got[p] != want[p]}
    assert diffs == {}

    # re-importing the unchanged image converts and uploads nothing, the tag still names it
    again = import_image(f"oci:{layout}:multi", f"{name}:1", oci_store, cache_dir=tmp_path / "cache")
    assert (again.converted, again.cached, again.uploaded_bytes) == (0, len(LAYERS), 0)
    assert again.digest == result.digest
    other = import_image(f"oci:{layout}:multi", f"{name}:2", oci_store, cache_dir=tmp_path / "cache")
    assert other.converted == 0 and oci_store.get_manifest(name, "2").digest == other.digest


def test_registry_layers_stream_into_the_converter(tmp_path: Path, registry, registry_store, oci_store):
    """From a registry, layers stream (ranged GETs, digest-checked) instead of `skopeo copy`; the
    blobs are the same as from the layout, and a registry store as destination works too."""
    layout = build_layout(tmp_path / "image")
    remote = registry.url.split("://", 1)[1] + f"/src/multi-{uuid.uuid4().hex[:8]}:t"
    subprocess.run(["skopeo", "copy", "-q", "--dest-tls-verify=false", f"oci:{layout}:multi", f"docker://{remote}"],
                   check=True, capture_output=True)
    from_layout = import_image(f"oci:{layout}:multi", f"os/a-{uuid.uuid4().hex[:6]}:1", oci_store,
                               cache_dir=tmp_path / "c1")
    name = f"os/b-{uuid.uuid4().hex[:6]}"
    streamed = import_image(f"docker://{remote}", f"{name}:1", registry_store, cache_dir=tmp_path / "c2")
    assert streamed.transfer == "registry-stream" and streamed.converted == len(LAYERS)
    assert [x["digest"] for x in streamed.layers] == [x["digest"] for x in from_layout.layers]
    # the layers (uploaded while converting), their EROFS images (plan/lowers.py) and the config
    assert streamed.uploaded_blobs == 2 * len(LAYERS) + 1
    for layer in streamed.layers:
        assert registry_store.has_blob(name, layer["digest"])
        assert registry_store.has_blob(name, layer["erofs"]["digest"])


def test_blob_stream_checks_the_digest() -> None:
    """A registry serving other bytes than the digest names fails the read at the end."""
    from rollstack.errors import IntegrityError
    from rollstack.store.stream import BlobStream

    class Lying:
        def read_blob(self, repo, digest, offset, length):
            return b"\x1f\x8b" + b"x" * (length - 2) if offset == 0 else b"x" * length

    with pytest.raises(IntegrityError), BlobStream(Lying(), "r", "sha256:" + "0" * 64, 100, block=30) as s:
        while s.read(1000):
            pass


def test_a_layer_that_copied_up_from_below_is_reconverted_when_the_layers_below_change(tmp_path: Path, oci_store):
    """The same upper layer bytes over a different lower layer: its cached conversion (which
    copied the hardlink target up from the old lower layer) must not be reused."""
    from rollstack.format.reader import LayerReader
    from rollstack.store import StoreBlobSource

    top = [H("bin/tool-link", "bin/tool"), F("bin/other", b"o")]
    a = build_layout(tmp_path / "a", "t", [[D("bin"), F("bin/tool", b"version A\n", 0o755)], top])
    b = build_layout(tmp_path / "b", "t", [[D("bin"), F("bin/tool", b"version B\n", 0o700)], top])
    cache = tmp_path / "cache"
    name = f"os/chain-{uuid.uuid4().hex[:8]}"
    first = import_image(f"oci:{a}:t", f"{name}:a", oci_store, cache_dir=cache)
    second = import_image(f"oci:{b}:t", f"{name}:b", oci_store, cache_dir=cache)
    assert (first.converted, second.converted, second.cached) == (2, 2, 0)
    for result, want, mode in ((first, b"version A\n", 0o755), (second, b"version B\n", 0o700)):
        reader = LayerReader(StoreBlobSource(oci_store, name, result.layers[1]["digest"]))
        copied = reader.toc.lookup("bin/tool")
        assert copied is not None and copied.mode == mode and reader.read(copied) == want
        assert reader.toc.lookup("bin/tool-link").link == "bin/tool"
    again = import_image(f"oci:{a}:t", f"{name}:a", oci_store, cache_dir=cache)
    assert again.converted == 0 and again.digest == first.digest
