"""`rollstack bench import`: `group import` throughput (MB/s of unpacked data), re-import time.

Side by side in one run, each into a fresh OCI layout store with a fresh conversion cache:
1. cold import from the OCI layout (pigz child + chunk workers; upload overlapped);
2. re-import of the unchanged image (cache hit: nothing downloaded, decompressed or uploaded;
   the tag is checked and kept) and an import of it under a new tag (a manifest is written);
3. with `--registry`: the image pushed to a local docker-registry (loopback) and imported from
   there, layers streamed into the converter;
4. with `--serial`: the same cold import with one thread and in-process gzip (the old path's
   shape, for the ratio).
CPU seconds (this process + children) and the load average are recorded beside every figure:
the machine is shared. Default image: `bench/import_image.py` (built once, cached).
"""

from __future__ import annotations

import os
import resource
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import typer


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def _timed_import(ref: str, store_root: Path, cache: Path, name_tag: str, **kw: Any) -> dict[str, Any]:
    from rollstack.plan.imports import import_image
    from rollstack.store.ocilayout import OciLayoutStore

    with OciLayoutStore(store_root) as store:
        load, cpu, t0 = _load(), _cpu(), time.perf_counter()
        result = import_image(ref, name_tag, store, cache_dir=cache, **kw)
        seconds = time.perf_counter() - t0
        cpu = _cpu() - cpu
        name, tag = name_tag.rsplit(":", 1)
        manifest = store.get_manifest(name, tag).digest
    mb = result.payload_bytes / 1e6
    return {"seconds": round(seconds, 3), "cpu_seconds": round(cpu, 2), "load_before": load, "load_after": _load(),
            "payload_bytes": result.payload_bytes, "mb_per_s": round(mb / seconds, 1) if mb else None,
            "converted": result.converted, "cached": result.cached, "uploaded_bytes": result.uploaded_bytes,
            "transfer": result.transfer, "digest": result.digest, "manifest_written": manifest == result.digest,
            "layers": [layer["digest"] for layer in result.layers]}


def _verify(cache: Path) -> dict[str, Any]:
    from rollstack.format.source import FileBlobSource
    from rollstack.format.verify import verify_layer

    blobs = sorted((cache / "import" / "blobs").iterdir())
    reports = [verify_layer(FileBlobSource(b)).to_dict() for b in blobs]
    return {"blobs": len(blobs), "ok": all(not r.get("errors") for r in reports)}


def run(ref: str, work: Path, *, registry: bool, serial: bool) -> dict[str, Any]:
    from rollstack_bench.report import machine_facts
    from rollstack.format import tarstream

    doc: dict[str, Any] = {"image": ref, "machine": machine_facts(), "cpus": os.cpu_count()}
    doc["cold"] = _timed_import(ref, work / "store", work / "cache", "bench/imported:1")
    doc["verify"] = _verify(work / "cache")
    doc["reimport"] = _timed_import(ref, work / "store", work / "cache", "bench/imported:1")
    doc["reimport_new_tag"] = _timed_import(ref, work / "store", work / "cache", "bench/imported:2")
    if serial:
        old = tarstream.GZIP_DECODER
        tarstream.GZIP_DECODER = "thread"
        try:
            doc["serial"] = _timed_import(ref, work / "store-serial", work / "cache-serial", "bench/imported:1", threads=1)
        finally:
            tarstream.GZIP_DECODER = old
        doc["serial"]["same_blobs"] = doc["serial"]["layers"] == doc["cold"]["layers"]
    if registry:
        doc["registry"] = _from_registry(ref, work)
    return doc


def _from_registry(ref: str, work: Path) -> dict[str, Any]:
    from rollstack.store.server import RegistryServer

    with RegistryServer(work / "registry", die_with_parent=True) as server:
        remote = server.url.split("://", 1)[1] + "/bench/source:1"
        subprocess.run(["skopeo", "copy", "-q", "--dest-tls-verify=false", ref, f"docker://{remote}"],
                       check=True, capture_output=True)
        out = _timed_import(f"docker://{remote}", work / "store-registry", work / "cache-registry", "bench/imported:1")
    return out


def _human(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"group import of {doc['image']}", box=None)
    for col in ("run", "seconds", "MB/s unpacked", "CPU s", "load", "converted", "transfer"):
        table.add_column(col, justify="left" if col in ("run", "transfer") else "right")
    for key in ("cold", "serial", "registry", "reimport", "reimport_new_tag"):
        r = doc.get(key)
        if r:
            table.add_row(key, f"{r['seconds']:.2f}", str(r["mb_per_s"] or "-"), f"{r['cpu_seconds']:.1f}",
                          f"{r['load_before']:.1f}", str(r["converted"]), r["transfer"] or "-")
    console = Console()
    console.print(table)
    console.print(f"payload {doc['cold']['payload_bytes'] / 1e6:.0f} MB; converted blobs verify: {doc['verify']['ok']}")


def register(app: typer.Typer) -> None:
    @app.command("import")
    def import_bench(
        image: Optional[str] = typer.Option(None, "--image", help="oci:DIR[:TAG] or docker://... (default: the cached Debian+PyPI one-layer image)"),
        registry: bool = typer.Option(False, "--registry", help="also import through a local docker-registry (streamed layers)"),
        serial: bool = typer.Option(False, "--serial", help="also run one thread + in-process gzip, for the ratio"),
        workdir: Optional[Path] = typer.Option(None, "--workdir", help="scratch space (default: a temp dir)"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
    ) -> None:
        """Import MB/s (unpacked data), re-import seconds; CPU and load beside each figure."""
        from rollstack_bench.import_image import TAG, default_image
        from rollstack.cli.output import emit

        ref = image or f"oci:{default_image()}:{TAG}"
        with tempfile.TemporaryDirectory(prefix="rollstack-bench-import-", dir=workdir) as tmp:
            doc = run(ref, Path(tmp), registry=registry, serial=serial)
        emit(doc, as_json, _human)
