"""`rollstack layer ...`: convert a directory/tarball into a layer blob, list, cat and verify it."""

from __future__ import annotations

import base64
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import typer

from rollstack.cli.output import emit, stdout
from rollstack.core.units import parse_binary_size

app = typer.Typer(no_args_is_help=True, help="Seekable layer blobs: convert, ls, cat, verify.")

@app.command("convert")
def convert_cmd(
    src: Path = typer.Argument(..., help="directory, .tar, .tar.gz/.tgz or .tar.zst"),
    dst: Path = typer.Argument(..., help="the layer blob to write"),
    chunk_size: str = typer.Option("1Mi", "--chunk-size", help="chunk size, binary units (e.g. 256Ki, 1Mi)"),
    level: int = typer.Option(3, "--level", help="zstd level for chunks"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Convert SRC into the seekable layer blob DST (deterministic: same input, same bytes)."""
    from rollstack.format.convert import convert

    info = convert(src, dst, chunk_size=parse_binary_size(chunk_size), level=level)
    doc = {"path": str(dst), **info.to_dict()}

    def human(d: dict[str, Any]) -> None:
        stdout.print(f"{d['digest']}  {d['size']} bytes  {d['entries']} entries  "
                     f"{d['chunks']} chunks  TOC {d['toc_size']} bytes  -> {d['path']}")

    emit(doc, as_json, human)


def _xattr_json(xattrs: dict[str, bytes]) -> dict[str, str]:
    return {k: base64.b64encode(v).decode() for k, v in xattrs.items()}


def _entry_doc(e: Any) -> dict[str, Any]:
    payload = None
    if e.chunks:
        start = min(c.blob_offset for c in e.chunks)
        end = max(c.blob_offset + c.blob_size for c in e.chunks)
        payload = {"offset": start, "length": end - start}
    return {
        "path": e.path, "type": e.type.value, "mode": f"{e.mode:04o}", "uid": e.uid, "gid": e.gid,
        "size": e.size, "mtime_ns": e.mtime_ns, "link": e.link or None,
        "rdev": [e.rdev_major, e.rdev_minor] if e.type.value in ("char", "block") else None,
        "opaque": e.opaque, "xattrs": _xattr_json(e.xattrs), "payload": payload,
        "chunks": [{"offset": c.offset, "size": c.size, "blob_offset": c.blob_offset,
                    "blob_size": c.blob_size, "digest": c.digest, "compression": c.compression.value}
                   for c in e.chunks],
    }


_TYPE_CHAR = {"reg": "-", "dir": "d", "symlink": "l", "hardlink": "h", "char": "c", "block": "b",
              "fifo": "p", "whiteout": "w"}


def _human_ls(doc: dict[str, Any]) -> None:
    for e in doc["entries"]:
        try:
            when = datetime.fromtimestamp(e["mtime_ns"] / 1e9, timezone.utc).strftime("%Y-%m-%d %H:%M")
        except (ValueError, OverflowError, OSError):  # mtimes outside what datetime can show
            when = f"@{e['mtime_ns'] // 10**9:<15}"
        name = e["path"] or "."
        if e["link"]:
            name += (" -> " if e["type"] == "symlink" else " link to ") + e["link"]
        if e["opaque"]:
            name += "  (opaque)"
        size = f"{e['rdev'][0]},{e['rdev'][1]}" if e["rdev"] else str(e["size"])
        stdout.print(f"{_TYPE_CHAR[e['type']]}{e['mode']} {e['uid']:>5} {e['gid']:>5} {size:>10} "
                     f"{when} {len(e['chunks']):>3}c  {name}", markup=False)


@app.command("ls")
def ls_cmd(
    blob: Path = typer.Argument(..., help="a layer blob"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """List the TOC: path, type, mode, uid, gid, size, mtime, link, xattrs, payload range, chunks."""
    from rollstack.format.reader import read_toc
    from rollstack.format.source import FileBlobSource

    with FileBlobSource(blob) as src:
        opened = read_toc(src)
    doc = {"blob": str(blob), "blob_size": opened.blob_size, "toc_offset": opened.footer.toc_offset,
           "toc_size": opened.footer.toc_length, "toc_raw_size": opened.footer.toc_raw_length,
           "entries": [_entry_doc(e) for e in opened.toc]}
    emit(doc, as_json, _human_ls)


@app.command("cat")
def cat_cmd(
    blob: Path = typer.Argument(..., help="a layer blob"),
    path: str = typer.Argument(..., help="file path inside the layer"),
) -> None:
    """Write one file's bytes to stdout, fetched chunk by chunk through the TOC."""
    from rollstack.format.paths import normalize
    from rollstack.format.reader import LayerReader
    from rollstack.format.source import FileBlobSource

    with FileBlobSource(blob) as src:
        reader = LayerReader(src)
        entry = reader.entry(normalize(path.lstrip("/")))
        reader.read(entry, 0, 0)  # type check (directories, devices...) before any output
        out = sys.stdout.buffer
        entry = reader.toc.resolve(entry)
        for chunk in reader.chunks_for(entry):
            out.write(reader.read_chunk(chunk))
        out.flush()


@app.command("verify")
def verify_cmd(
    blob: Path = typer.Argument(..., help="a layer blob"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Check footer, TOC and every chunk digest; exit 0 only if all hold."""
    from rollstack.format.source import FileBlobSource
    from rollstack.format.verify import verify_layer

    with FileBlobSource(blob) as src:
        report = verify_layer(src)

    def human(d: dict[str, Any]) -> None:
        if d["ok"]:
            stdout.print(f"ok: {d['entries']} entries, {d['chunks_checked']} chunks verified")
        for p in d["problems"]:
            print(f"error: integrity_error: {p}", file=sys.stderr)

    emit({"blob": str(blob), **report.to_dict()}, as_json, human)
    if not report.ok:
        raise typer.Exit(1)
