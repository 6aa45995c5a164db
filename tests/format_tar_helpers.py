"""Tar/layer builders shared by the tests that build tar streams (the format tests, the plan
import tests): `ti()` a member header, `tar_bytes()` a tar of (header, data or None) members."""

from __future__ import annotations

import io
import tarfile

Member = tuple[tarfile.TarInfo, "bytes | None"]


def ti(name: str, type_: bytes = tarfile.REGTYPE, **kw: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = type_
    for k, v in kw.items():
        setattr(info, k, v)
    return info


def tar_bytes(members: list[Member], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            else:
                tf.addfile(info)
    return buf.getvalue()


def layer_bytes(members: list[Member], **kw: int) -> bytes:
    from rollstack.format import convert_tar

    out = io.BytesIO()
    convert_tar(io.BytesIO(tar_bytes(members)), out, **kw)
    return out.getvalue()


