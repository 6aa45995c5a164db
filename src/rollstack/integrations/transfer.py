"""Directories in and out of an environment as one tar each way (the Harbor provider's
`upload_dir`/`download_dir`): packed with owner root, unpacked on the host with tarfile's `data`
filter, since what comes out of an environment is untrusted."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path


def pack_dir(source: Path) -> bytes:
    """`source`'s contents (not `source` itself) as an uncompressed tar, owner root, modes kept."""
    def as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for child in sorted(source.iterdir()):
            tar.add(child, arcname=child.name, filter=as_root)
    return buf.getvalue()


def unpack_into(blob: bytes, target: Path) -> None:
    """Extract a tar from an environment into `target`. Device files and FIFOs are skipped (a
    pipe left in a log directory must not cost the rest of it); absolute names, `..` and links
    leading out of `target` are refused (`tarfile.FilterError`): nothing is written outside."""
    target.mkdir(parents=True, exist_ok=True)

    def keep(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        if member.isdev():  # character, block devices and FIFOs
            return None
        return tarfile.data_filter(member, dest)

    with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
        tar.extractall(target, filter=keep)


def write_bytes(target: Path, data: bytes) -> None:
    """`data` as file `target` (its parents created)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
