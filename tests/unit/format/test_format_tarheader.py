"""FastTarInfo.frombuf agrees with tarfile.TarInfo.frombuf: same member, or the same error."""

from __future__ import annotations

import io
import tarfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollstack.format.tarheader import FastTarInfo

ENC, ERR = "utf-8", "surrogateescape"


def _parse(cls: type[tarfile.TarInfo], buf: bytes) -> object:
    try:
        ti = cls.frombuf(buf, ENC, ERR)
    except tarfile.HeaderError as exc:
        return type(exc)
    return ti.get_info(), ti.chksum, getattr(ti, "_sparse_structs", None)


def _header(name: str, fmt: int, **kw: object) -> bytes:
    ti = tarfile.TarInfo(name)
    for k, v in kw.items():
        setattr(ti, k, v)
    return ti.tobuf(fmt, ENC, ERR)[:512]


def _agree(buf: bytes) -> None:
    assert _parse(FastTarInfo, buf) == _parse(tarfile.TarInfo, buf)


def test_ordinary_headers_of_every_format_and_type_parse_the_same() -> None:
    for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        for type_ in (tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE,
                      tarfile.FIFOTYPE):
            buf = _header("usr/lib/python3/site-packages/x.py", fmt, type=type_, size=0 if type_ != tarfile.REGTYPE else 7,
                          mode=0o4755, uid=1000, gid=1000, mtime=1_700_000_000, linkname="target",
                          uname="user", gname="group", devmajor=1, devminor=3)
            _agree(buf)
            assert FastTarInfo.frombuf(buf, ENC, ERR).name.startswith("usr/")


def test_prefix_v7_directories_base256_sparse_and_empty_blocks_match() -> None:
    deep = "d/" * 60 + "file"  # ustar splits it into prefix + name
    _agree(_header(deep, tarfile.USTAR_FORMAT))
    v7 = bytearray(_header("olddir/", tarfile.USTAR_FORMAT))
    v7[156:157] = tarfile.AREGTYPE
    _agree(_fix_checksum(v7))
    _agree(_header("big", tarfile.GNU_FORMAT, size=1 << 40, uid=1 << 30))  # base-256 numbers
    sparse = bytearray(_header("sp", tarfile.GNU_FORMAT))
    sparse[156:157] = tarfile.GNUTYPE_SPARSE
    _agree(_fix_checksum(sparse))
    for buf in (b"", b"\0" * 512, b"x" * 100):
        _agree(buf)


def test_bad_checksum_bad_numbers_and_signed_checksums() -> None:
    buf = bytearray(_header("a", tarfile.USTAR_FORMAT))
    buf[0] ^= 1
    _agree(bytes(buf))  # bad checksum
    bad = bytearray(_header("a", tarfile.USTAR_FORMAT))
    bad[100:108] = b"09\x1c7 \0\0\0"
    _agree(_fix_checksum(bad))  # a non-octal digit
    odd = bytearray(_header("a", tarfile.USTAR_FORMAT))
    odd[100:108] = b"\x1c644\0\0\0\0"
    _agree(_fix_checksum(odd))  # str.strip() whitespace that bytes.strip() would keep
    high = bytearray(_header("\xe9t\xe9", tarfile.USTAR_FORMAT))
    signed = 256 + sum((b - 256 if b > 127 else b) for i, b in enumerate(high) if not 148 <= i < 156)
    high[148:156] = b"%06o\0 " % signed
    _agree(bytes(high))  # Sun/NeXT signed-char checksum
    assert FastTarInfo.frombuf(bytes(high), ENC, ERR).name == "\xe9t\xe9"


def _fix_checksum(buf: bytearray) -> bytes:
    buf[148:156] = b" " * 8
    buf[148:156] = b"%06o\0 " % (sum(buf))
    return bytes(buf)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(min_size=512, max_size=512))
def test_arbitrary_blocks_agree(buf: bytes) -> None:
    _agree(buf)
    _agree(_fix_checksum(bytearray(buf)))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 511), st.integers(0, 255), st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT]),
       st.booleans())
def test_mutated_headers_agree(pos: int, byte: int, fmt: int, refix: bool) -> None:
    buf = bytearray(_header("pkg/node_modules/a/index.js", fmt, size=1234, mtime=1_600_000_000, uname="u"))
    buf[pos] = byte
    _agree(_fix_checksum(buf) if refix else bytes(buf))


def test_a_whole_archive_reads_the_same_members() -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for i in range(50):
            ti = tarfile.TarInfo(f"dir{i % 3}/{'long' * (i % 40)}-{i}\u00e9")
            data = b"x" * i
            ti.size, ti.mtime = len(data), 1_600_000_000.5 + i
            tf.addfile(ti, io.BytesIO(data))

    def members(cls: type[tarfile.TarInfo]) -> list[dict[str, object]]:
        raw.seek(0)
        with tarfile.open(fileobj=raw, mode="r:", tarinfo=cls) as tf:
            return [dict(m.get_info(), pax=dict(m.pax_headers)) for m in tf.getmembers()]

    assert members(FastTarInfo) == members(tarfile.TarInfo)
    assert len(members(FastTarInfo)) == 50
