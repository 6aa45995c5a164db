"""`rollstack bench convert`: layer conversion throughput, blob size vs tar.gz, TOC size, and
how many range requests opening the layer takes. All figures measured side by side in one run.

Default source: a real root filesystem (Debian bookworm minbase + python3 via debootstrap),
built once and cached under ~/.cache/rollstack_bench/.
"""

from __future__ import annotations

from rollstack.format import toc_codec

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import typer

from rollstack.errors import InvalidRequest, RuntimeFailure

CACHE = Path.home() / ".cache" / "rollstack" / "bench"
ROOTFS_NAME = "rootfs-bookworm-minbase-python3"
DEBOOTSTRAP = ["debootstrap", "--variant=minbase", "--include=python3", "bookworm"]
MIRROR = "http://deb.debian.org/debian"


def _log(msg: str) -> None:
    print(f"[bench convert] {msg}", file=sys.stderr, flush=True)


def default_rootfs(cache: Path = CACHE) -> Path:
    """The cached debootstrap tree, built on first use (needs root and Debian's mirror)."""
    dest = cache / ROOTFS_NAME
    if dest.is_dir():
        return dest
    if os.geteuid() != 0 or not shutil.which("debootstrap"):
        raise InvalidRequest("building the default benchmark rootfs needs root and debootstrap; pass --src")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f"{ROOTFS_NAME}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    _log(f"building {dest} with debootstrap (once; cached)")
    proc = subprocess.run([*DEBOOTSTRAP, str(tmp), MIRROR], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeFailure(f"debootstrap failed: {proc.stderr.strip()[-500:]}")
    tmp.rename(dest)  # only a complete tree ever gets the final name
    return dest


def machine_facts() -> dict[str, Any]:
    import zstandard

    from rollstack_bench.report import machine_facts as common_facts

    return {**common_facts(), "zstandard": zstandard.__version__}


def _tar_gz_baseline(src: Path, work: Path) -> dict[str, Any]:
    """The same tree as a tar.gz at gzip -6 (GNU tar + gzip, the usual OCI layer encoding)."""
    out = work / "baseline.tar.gz"
    t0 = time.perf_counter()
    if src.is_dir():
        tar = subprocess.Popen(["tar", "--xattrs", "--xattrs-include=*", "--format=pax", "--sort=name",
                                "-cf", "-", "-C", str(src), "."], stdout=subprocess.PIPE)
        cmd_in = tar.stdout
    else:
        tar = None
        cmd_in = open(src, "rb")
        if _is_compressed(src):  # recompress the plain tar stream for a like-for-like baseline
            tar = subprocess.Popen(["zstd", "-dcq"] if _magic(src).startswith(b"\x28\xb5\x2f\xfd") else ["gzip", "-dc"],
                                   stdin=cmd_in, stdout=subprocess.PIPE)
            cmd_in = tar.stdout
    with open(out, "wb") as f:
        subprocess.run(["gzip", "-6", "-c"], stdin=cmd_in, stdout=f, check=True)
    if tar is not None and tar.wait() != 0:
        raise RuntimeFailure("creating the tar.gz baseline failed")
    return {"tar_gz_size": out.stat().st_size, "tar_gz_wall_s": round(time.perf_counter() - t0, 3)}


def _magic(p: Path) -> bytes:
    with open(p, "rb") as f:
        return f.read(4)


def _is_compressed(p: Path) -> bool:
    m = _magic(p)
    return m.startswith(b"\x1f\x8b") or m.startswith(b"\x28\xb5\x2f\xfd")


def _convert_once(src: Path, dst: Path, chunk_size: int, level: int) -> dict[str, Any]:
    from rollstack.format import convert

    import resource

    def cpu_now() -> float:  # this process's threads + children (a pigz decoding a tar.gz)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + kids.ru_utime + kids.ru_stime

    c0, w0 = cpu_now(), time.perf_counter()
    info = convert(src, dst, chunk_size=chunk_size, level=level)
    cpu, wall = cpu_now() - c0, time.perf_counter() - w0
    return {"level": level, "info": info.to_dict(), "cpu_s": round(cpu, 3), "wall_s": round(wall, 3),
            "mb_per_s_cpu": round(info.payload_size / cpu / 1e6, 1)}


def _open_cost(blob: Path) -> dict[str, Any]:
    from rollstack.format import FileBlobSource
    from rollstack.format.reader import TAIL_READ, LayerReader, default_tail

    out: dict[str, Any] = {}
    for label, tail in (("default_tail", None), ("tail_64k", TAIL_READ)):
        with FileBlobSource(blob) as src:
            t0 = time.perf_counter()
            reader = LayerReader(src, tail=tail)
            ms = (time.perf_counter() - t0) * 1e3
            out[label] = {"requests": src.requests, "bytes_read": src.bytes_read,
                          "tail": tail or default_tail(src.size()), "open_ms": round(ms, 2)}
            t0 = time.perf_counter()
            _ = reader.toc.entries  # materialise everything, as `layer ls` would
            out[label]["materialise_all_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    return out


def synthetic_toc_decode(n: int = 50_000) -> dict[str, Any]:
    """Decode cost of a TOC with n single-chunk files (a big language-runtime layer)."""
    import hashlib

    from rollstack.format.toc import Chunk, EntryType, Toc, TocEntry

    entries = [TocEntry(f"usr/lib/python3/site-packages/pkg{i // 100}/module_{i}.py", EntryType.REG, 0o644,
                        mtime_ns=1_700_000_000_000_000_000 + i, size=5000,
                        chunks=[Chunk(0, 5000, i * 2000, 2000, "sha256:" + hashlib.sha256(b"%d" % i).hexdigest())])
               for i in range(n)]
    data = toc_codec.encode(Toc(entries))
    t0 = time.perf_counter()
    toc = toc_codec.decode(data)
    decode_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    toc.lookup(entries[n // 2].path)
    lookup_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    _ = toc.entries
    all_ms = (time.perf_counter() - t0) * 1e3
    return {"entries": n, "toc_size": len(data), "decode_ms": round(decode_ms, 1),
            "first_lookup_ms": round(lookup_ms, 1), "materialise_all_ms": round(all_ms, 1)}


def run(src: Path, chunk_size: int, levels: list[int], work: Path, command: str = "rollstack bench convert") -> dict[str, Any]:
    _log(f"source {src}")
    baseline = _tar_gz_baseline(src, work)
    runs = []
    for level in levels:
        _log(f"converting at zstd level {level}")
        r = _convert_once(src, work / f"layer-{level}.blob", chunk_size, level)
        r["size_vs_tar_gz"] = round(r["info"]["size"] / baseline["tar_gz_size"], 4)
        runs.append(r)
    main = runs[0]
    info = main["info"]
    if src.is_dir():  # the `group import` path: a gzip'd tar stream, decompressed while converting
        _log("converting the tar.gz baseline (tarball input)")
        tgz = _convert_once(work / "baseline.tar.gz", work / "from-tgz.blob", chunk_size, levels[0])
        tgz_input = {"mb_per_s_cpu": tgz["mb_per_s_cpu"], "cpu_s": tgz["cpu_s"],
                     "same_blob_as_directory": tgz["info"]["digest"] == info["digest"]}
    else:
        tgz_input = None
    opened = _open_cost(work / f"layer-{levels[0]}.blob")
    return {
        "command": command,
        "machine": machine_facts(),
        "source": str(src),
        "entries": info["entries"], "files": info["files"], "payload_bytes": info["payload_size"],
        "chunk_size": chunk_size,
        "throughput_mb_per_s_one_core": main["mb_per_s_cpu"],
        "tar_gz_input": tgz_input,
        "blob_size": info["size"], **baseline, "size_vs_tar_gz": main["size_vs_tar_gz"],
        "toc_size": info["toc_size"], "toc_raw_size": info["toc_raw_size"],
        "chunks": info["chunks"], "chunk_refs": info["chunk_refs"],
        "open": opened,
        "synthetic_toc_50k": synthetic_toc_decode(),
        "levels": [{k: v for k, v in r.items() if k != "info"} | {"blob_size": r["info"]["size"]} for r in runs],
        "targets": {
            "throughput_ge_50_mb_s": main["mb_per_s_cpu"] >= 50,
            "blob_within_10pct_of_tar_gz": main["size_vs_tar_gz"] <= 1.10,
            "open_requests_le_2": opened["tail_64k"]["requests"] <= 2,
            "open_one_request_if_toc_lt_64k": info["toc_size"] >= 65536 or opened["tail_64k"]["requests"] == 1,
        },
    }


def _human(doc: dict[str, Any]) -> None:
    m = doc["machine"]
    print(f"machine: {m['cpu']} ({m['cores']} cores, load {m['loadavg']:.2f}), python {m['python']}, zstandard {m['zstandard']}")
    print(f"command: {doc['command']}")
    print(f"source:  {doc['source']}  ({doc['entries']} entries, {doc['files']} files, {doc['payload_bytes'] / 1e6:.1f} MB payload)")
    print(f"throughput: {doc['throughput_mb_per_s_one_core']} MB/s on one core (CPU time)")
    if doc["tar_gz_input"]:
        t = doc["tar_gz_input"]
        print(f"from the tar.gz instead: {t['mb_per_s_cpu']} MB/s (gzip decode included); "
              f"same blob as from the directory: {t['same_blob_as_directory']}")
    print(f"blob: {doc['blob_size']:,} B   tar.gz -6: {doc['tar_gz_size']:,} B   ratio {doc['size_vs_tar_gz']:.3f}")
    print(f"TOC: {doc['toc_size']:,} B compressed, {doc['toc_raw_size']:,} B raw; "
          f"{doc['chunks']} stored chunks ({doc['chunk_refs']} references)")
    for label, o in doc["open"].items():
        print(f"open ({label}, {o['tail']} B tail): {o['requests']} read_at requests, {o['bytes_read']:,} B, "
              f"{o['open_ms']} ms; materialise all entries {o['materialise_all_ms']} ms")
    sy = doc["synthetic_toc_50k"]
    print(f"synthetic {sy['entries']}-entry TOC ({sy['toc_size']:,} B): decode {sy['decode_ms']} ms, "
          f"first lookup {sy['first_lookup_ms']} ms, materialise all {sy['materialise_all_ms']} ms")
    for lv in doc["levels"]:
        print(f"  level {lv['level']}: {lv['mb_per_s_cpu']} MB/s, blob {lv['blob_size']:,} B ({lv['size_vs_tar_gz']:.3f}x tar.gz)")
    print("targets: " + ", ".join(f"{k}={'PASS' if v else 'MISS'}" for k, v in doc["targets"].items()))


def register(app: typer.Typer) -> None:
    @app.command("convert")
    def convert_bench(
        src: Optional[Path] = typer.Option(None, "--src", help="directory or tarball (default: cached debootstrap rootfs)"),
        chunk_size: str = typer.Option("1Mi", "--chunk-size"),
        levels: str = typer.Option("3", "--levels", help="zstd levels to compare, first is the headline (e.g. 3,6,9)"),
        workdir: Optional[Path] = typer.Option(None, "--workdir", help="scratch space (default: a temp dir)"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
    ) -> None:
        """Conversion throughput, blob size vs tar.gz, TOC size, range requests to open."""
        from rollstack.core.units import parse_binary_size
        from rollstack.cli.output import emit

        source = src if src is not None else default_rootfs()
        if not source.exists():
            raise InvalidRequest(f"--src {source} does not exist")
        lv = [int(x) for x in levels.split(",") if x.strip()]
        with tempfile.TemporaryDirectory(prefix="rollstack-bench-convert-", dir=workdir) as tmp:
            command = "rollstack bench convert" + (f" --src {src}" if src else "") + \
                (f" --chunk-size {chunk_size}" if chunk_size != "1Mi" else "") + (f" --levels {levels}" if levels != "3" else "")
            doc = run(source, parse_binary_size(chunk_size), lv, Path(tmp), command)
        emit(doc, as_json, _human)
