"""`rollstack group ...`: publish directories/tarballs as a layer group, import images, list groups."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from rollstack.cli.output import emit, stderr, stdout

app = typer.Typer(no_args_is_help=True, help="Layer groups: publish, import, ls.")

STORE_HELP = "oci:PATH, a path, or http(s)://host:port (default: $ROLLSTACK_STORE or ~/.local/share/rollstack/store)"


class RichProgress:
    """Rich progress bars on stderr (transient: they vanish when a step is done)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and stderr.is_terminal
        self._bar: Any = None
        self._task: Any = None

    def start(self, description: str, total: int) -> None:
        if not self.enabled:
            return
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

        self.done()
        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn()
                             if total > 10_000 else TextColumn("{task.completed}/{task.total}"),
                             TimeElapsedColumn(), console=stderr, transient=True)
        self._bar.start()
        self._task = self._bar.add_task(description, total=total)

    def advance(self, amount: int = 1) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, amount)

    def done(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _open(store: Optional[str]) -> Any:
    from rollstack.store import open_store

    return open_store(store)


def _remember(store: Any, cache_dir: Optional[Path], name_tag: str, digest: str, layers: list[dict[str, Any]]) -> None:
    """Point this machine's resolution cache for `name_tag` at what was just written."""
    from rollstack.plan.resolve import Resolver, default_cache_dir

    images = {d["digest"]: (d["erofs"]["digest"], d["erofs"]["size"]) for d in layers if d.get("erofs")}
    Resolver(store, cache_dir or default_cache_dir()).remember(
        name_tag, digest, [(d["digest"], d["size"]) for d in layers], images)


@app.command("publish")
def publish(
    name_tag: str = typer.Argument(..., metavar="NAME:TAG", help="e.g. repo/attrs:23.2.0"),
    sources: list[Path] = typer.Argument(..., metavar="SRC...", help="directories or tarballs, one layer each, bottom first"),
    store: Optional[str] = typer.Option(None, "--store", envvar="ROLLSTACK_STORE", help=STORE_HELP),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="resolution cache to update (default: ~/.cache/rollstack)"),
    kind: Optional[str] = typer.Option(None, "--kind", help="component kind: os, repo, harness, evaluator, ... (default: NAME's first component)"),
    source: Optional[str] = typer.Option(None, "--source", help="where the content came from (annotation)"),
    created: Optional[str] = typer.Option(None, "--created", help="creation time to record (default: now); fixes the manifest digest"),
    probe: Optional[str] = typer.Option(None, "--probe", help="run this command (sh -c) once in a throwaway "
                                        "environment and publish its access trace beside the group (needs root)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Publish SRC... as group NAME:TAG; prints the group's digest. Unchanged blobs are not uploaded.

    Each layer's EROFS metadata image is published beside it, so nodes mount it instead of
    building it (docs/packaging.md).

    This machine's resolution cache learns the new digest at once; other machines' caches pick it
    up within their tag TTL (60 s by default, `plan resolve --ttl`)."""
    from rollstack.plan.groups import publish_group

    st = _open(store)
    try:
        result = publish_group(st, name_tag, sources, kind=kind, source_desc=source, created=created,
                               progress=RichProgress())
        _remember(st, cache_dir, name_tag, result.digest, result.layers)
    finally:
        st.close()
    doc = {**result.to_dict(), "store": st.url}
    if probe:
        from rollstack.node.probe import probe_group

        doc["probe"] = probe_group(st.url, [name_tag], probe)

    def human(d: dict[str, Any]) -> None:
        images = sum(1 for layer in d["layers"] if layer.get("erofs"))
        stderr.print(f"{d['name']}:{d['tag']}: {len(d['layers'])} layer(s) ({images} with an EROFS image), "
                     f"uploaded {d['uploaded_blobs']} blob(s), "
                     f"{d['uploaded_bytes']} bytes{' (unchanged)' if d['unchanged'] else ''}")
        stdout.print(d["digest"])

    emit(doc, as_json, human)


@app.command("import")
def import_cmd(
    image: str = typer.Argument(..., metavar="IMAGE_REF", help="oci:DIR[:TAG], docker://HOST/NAME:TAG, or HOST/NAME:TAG"),
    name_tag: str = typer.Argument(..., metavar="NAME:TAG"),
    store: Optional[str] = typer.Option(None, "--store", envvar="ROLLSTACK_STORE", help=STORE_HELP),
    kind: Optional[str] = typer.Option(None, "--kind", help="component kind (default: NAME's first component)"),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="conversion cache (default: ~/.cache/rollstack)"),
    tls_verify: bool = typer.Option(False, "--tls-verify/--no-tls-verify", help="verify the source registry's TLS"),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="chunk compression workers (default: one per core; 1 uses the least CPU on a busy node)"),
    probe: Optional[str] = typer.Option(None, "--probe", help="run this command (sh -c) once in a throwaway "
                                        "environment and publish its access trace beside the group (needs root)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Convert an existing OCI/Docker image's layers into group NAME:TAG (cached by layer digest),
    each layer's EROFS metadata image published beside it (docs/packaging.md)."""
    from rollstack.plan.imports import import_image
    from rollstack.plan.resolve import default_cache_dir

    st = _open(store)
    try:
        result = import_image(image, name_tag, st, cache_dir=cache_dir or default_cache_dir(), kind=kind,
                              tls_verify=tls_verify, progress=RichProgress(), threads=threads)
        _remember(st, cache_dir, name_tag, result.digest, result.layers)
    finally:
        st.close()
    doc = {**result.to_dict(), "store": st.url}
    if probe:
        from rollstack.node.probe import probe_group

        doc["probe"] = probe_group(st.url, [name_tag], probe)

    def human(d: dict[str, Any]) -> None:
        rate = f" ({d['payload_bytes'] / 1e6 / d['seconds']:.0f} MB/s unpacked)" if d["converted"] and d["seconds"] else ""
        stderr.print(f"{d['name']}:{d['tag']}: {len(d['layers'])} layer(s) from {image}, "
                     f"converted {d['converted']}, cached {d['cached']}, uploaded {d['uploaded_bytes']} bytes "
                     f"in {d['seconds']:.2f} s{rate}")
        stdout.print(d["digest"])

    emit(doc, as_json, human)


@app.command("ls")
def ls(
    store: Optional[str] = typer.Option(None, "--store", envvar="ROLLSTACK_STORE", help=STORE_HELP),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Groups, tags, digests, sizes and layer counts, and how many artifacts the store holds."""
    from rollstack.plan.groups import list_groups, summarize

    st = _open(store)
    try:
        groups = list_groups(st)
    finally:
        st.close()
    doc = {"store": st.url, "groups": [g.to_dict() for g in groups], **summarize(groups)}

    def human(d: dict[str, Any]) -> None:
        from rich.table import Table

        table = Table(box=None, pad_edge=False)
        for col in ("GROUP", "KIND", "LAYERS", "SIZE", "DIGEST", "CREATED"):
            table.add_column(col, justify="right" if col in ("LAYERS", "SIZE") else "left")
        for g in d["groups"]:
            table.add_row(f"{g['name']}:{g['tag']}", g["kind"], str(g["layers"]), _human_size(g["size"]),
                          g["digest"][:19], g["created"])
        stdout.print(table)
        stdout.print(f"{d['artifacts']} artifact(s), {d['tags']} tag(s), {d['layers']} distinct layer(s), "
                     f"{_human_size(d['layer_bytes'])} in {d['store']}")

    emit(doc, as_json, human)


def _human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
