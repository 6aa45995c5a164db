"""Property tests: random trees -> tar -> layer -> every entry and every byte reads back equal."""

from __future__ import annotations

from rollstack.format import toc_codec

import io
import tarfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollstack.format import BytesBlobSource, EntryType, LayerReader, Toc, convert_tar

from format_tar_helpers import tar_bytes, ti

NAMES = st.text(alphabet="abcXYZ_-. é☃0", min_size=1, max_size=6).filter(
    lambda s: s not in (".", "..") and not s.startswith(".wh."))
CONTENT = st.one_of(
    st.binary(max_size=3000),
    st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=64), st.integers(1, 600)),  # compressible, dedupes
)
KINDS = ["file", "file", "file", "dir", "dir", "symlink", "hardlink", "fifo", "chr", "blk"]


@st.composite
def trees(draw: st.DrawFn) -> list[dict]:
    specs: list[dict] = []
    dirs, files, taken = [""], [], set()
    for _ in range(draw(st.integers(1, 20))):
        parent = draw(st.sampled_from(dirs))
        name = draw(NAMES)
        path = f"{parent}/{name}" if parent else name
        if path in taken:
            continue
        taken.add(path)
        kind = draw(st.sampled_from(KINDS))
        if kind == "hardlink" and not files:
            kind = "file"
        spec = {"path": path, "kind": kind, "mode": draw(st.integers(0, 0o7777)),
                "uid": draw(st.integers(0, 70_000)), "gid": draw(st.integers(0, 70_000)),
                "mtime": draw(st.integers(0, 2**33)), "xattrs": {}}
        if kind == "file":
            spec["data"] = draw(CONTENT)
            spec["xattrs"] = draw(st.dictionaries(st.sampled_from(["user.a", "user.b", "security.c"]),
                                                  st.text(alphabet="xyz09=", max_size=10), max_size=2))
            files.append(path)
        elif kind == "dir":
            dirs.append(path)
        elif kind == "symlink":
            spec["link"] = draw(st.text(alphabet="ab/.", min_size=1, max_size=12))
        elif kind == "hardlink":
            spec["link"] = draw(st.sampled_from(files))
        elif kind in ("chr", "blk"):
            spec["rdev"] = (draw(st.integers(0, 4095)), draw(st.integers(0, 2**20 - 1)))
        specs.append(spec)
    return specs


_TAR_TYPE = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
             "hardlink": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE, "chr": tarfile.CHRTYPE,
             "blk": tarfile.BLKTYPE}
_ENTRY_TYPE = {"file": EntryType.REG, "dir": EntryType.DIR, "symlink": EntryType.SYMLINK,
               "hardlink": EntryType.HARDLINK, "fifo": EntryType.FIFO, "chr": EntryType.CHAR,
               "blk": EntryType.BLOCK}


def _to_tar(specs: list[dict]) -> bytes:
    members = []
    for s in specs:
        info = ti("./" + s["path"], _TAR_TYPE[s["kind"]], mode=s["mode"], uid=s["uid"], gid=s["gid"],
                  mtime=s["mtime"], linkname=s.get("link", ""))
        if "rdev" in s:
            info.devmajor, info.devminor = s["rdev"]
        info.pax_headers = {f"SCHILY.xattr.{k}": v for k, v in s["xattrs"].items()}
        members.append((info, s.get("data")))
    return tar_bytes(members)


def _convert(tar: bytes, chunk_size: int) -> bytes:
    out = io.BytesIO()
    convert_tar(io.BytesIO(tar), out, chunk_size=chunk_size)
    return out.getvalue()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=trees(), chunk_size=st.sampled_from([4096, 8192, 1 << 20]), data=st.data())
def test_tree_round_trip(specs: list[dict], chunk_size: int, data: st.DataObject) -> None:
    tar = _to_tar(specs)
    blob = _convert(tar, chunk_size)
    assert _convert(tar, chunk_size) == blob  # deterministic
    reader = LayerReader(BytesBlobSource(blob))
    toc = reader.toc
    contents = {s["path"]: s["data"] for s in specs if s["kind"] == "file"}
    for s in specs:
        e = toc.lookup(s["path"])
        assert e is not None, s["path"]
        assert (e.type, e.mode, e.uid, e.gid, e.mtime_ns) == (
            _ENTRY_TYPE[s["kind"]], s["mode"], s["uid"], s["gid"], s["mtime"] * 10**9)
        assert e.xattrs == {k: v.encode() for k, v in s["xattrs"].items()}
        if s["kind"] in ("symlink", "hardlink"):
            assert e.link == s["link"]
        if "rdev" in s:
            assert (e.rdev_major, e.rdev_minor) == s["rdev"]
        if s["kind"] in ("file", "hardlink"):
            payload = contents[s["path"] if s["kind"] == "file" else s["link"]]
            assert e.size == len(payload)
            assert reader.read(e) == payload
            if payload:
                off = data.draw(st.integers(0, len(payload) - 1))
                length = data.draw(st.integers(0, len(payload)))
                assert reader.read(e, off, length) == payload[off:off + length]
                chunks = reader.chunks_for(e, off, max(length, 1))
                assert chunks[0].offset <= off < chunks[-1].offset + chunks[-1].size
                assert len(chunks) == (min(off + max(length, 1), len(payload)) - 1) // chunk_size - off // chunk_size + 1
    # every implicit ancestor exists as a directory; nothing else appeared
    expected = {s["path"] for s in specs} | {""}
    assert set(toc.paths) == expected
    assert toc_codec.decode(toc_codec.encode(Toc(toc.entries))).entries == toc.entries
