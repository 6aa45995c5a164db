"""`rollstack bench corpus build|show|publish|baselines`: the CLI of `rollstack_corpus`.

The corpus itself (building, loading, publishing) lives in `rollstack_corpus.build`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from rollstack_corpus.build import (
    build_corpus, corpus_dir, load_corpus, log_stderr, publish_corpus, stack_summary,
)
from rollstack.tasks.model import CorpusManifest


def _human(doc: dict[str, Any]) -> None:
    from rollstack.cli.output import stdout

    stdout.print(f"corpus {doc['flavor']} at {doc['path']}: {doc['tasks']} tasks {doc['tasks_per_repo']}")
    for c in doc["components"]:
        stdout.print(f"  {c['name']:<26} {c['group']:<36} {c['bytes'] / 1e6:9.1f} MB {c['files']:>7} files")
    for s in doc.get("stacks", []):
        stdout.print(f"  stack {'+'.join(s['stack'])}: {s['bytes'] / 1e6:.1f} MB, {s['files']} files")


def register(app: typer.Typer) -> None:
    corpus_app = typer.Typer(no_args_is_help=True, help="The realistic SWE corpus (Debian + PyPI + npm).")

    @corpus_app.command("build")
    def build_cmd(
        out: Optional[Path] = typer.Option(None, "--out", help="corpus directory (default: cache/<flavor>)"),
        small: bool = typer.Option(False, "--small", help="the demo corpus: 1 repository, 1 harness, 4 tasks"),
        force: bool = typer.Option(False, "--force", help="rebuild every component"),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """Build the corpus (cached: a rebuild of a built corpus returns in seconds)."""
        flavor = "small" if small else "full"
        manifest = build_corpus(flavor, out, force=force)
        _emit(corpus_dir(flavor, out), manifest, as_json)

    @corpus_app.command("show")
    def show_cmd(
        out: Optional[Path] = typer.Option(None, "--out"),
        small: bool = typer.Option(False, "--small"),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """Describe a built corpus."""
        root = corpus_dir("small" if small else "full", out)
        manifest, _ = load_corpus(root)
        _emit(root, manifest, as_json)

    @corpus_app.command("publish")
    def publish_cmd(
        store: str = typer.Option(..., "--store", help="store spec: oci:PATH or http://host:port"),
        out: Optional[Path] = typer.Option(None, "--out"),
        small: bool = typer.Option(False, "--small"),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """Publish every component of a built corpus as a layer group."""
        from rollstack.cli.output import emit

        emit({"published": publish_corpus(corpus_dir("small" if small else "full", out), store)}, as_json)

    @corpus_app.command("baselines")
    def baselines_cmd(
        out: Optional[Path] = typer.Option(None, "--out", help="corpus directory"),
        small: bool = typer.Option(False, "--small"),
        profile: str = typer.Option("dc", "--profile", help="link profile: lan, dc, wan"),
        cold: int = typer.Option(3, "--cold", help="cold inits per system"),
        warm: int = typer.Option(5, "--warm", help="warm inits per system"),
        results: Optional[Path] = typer.Option(None, "--results", help="write results.json/.md/plots here"),
        stack: Optional[str] = typer.Option(None, "--stack", help="REPO--HARNESS, e.g. attrs--claude-code (default: first)"),
        systems: str = typer.Option("docker-equivalent,dynamic-assembly", "--systems", help="comma-separated"),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """Cold/warm init of the containerd baselines (docker-equivalent, dynamic-assembly) on the corpus."""
        from rollstack_bench.systems.rig import measure_baselines
        from rollstack_bench.report import current_command, machine_facts, write_results
        from rollstack.cli.output import emit

        doc = measure_baselines(corpus_dir("small" if small else "full", out), profile=profile,
                                systems=[x.strip() for x in systems.split(",") if x.strip()],
                                cold_runs=cold, warm_runs=warm, log=log_stderr,
                                stack_filter=lambda st: stack is None or st.name == stack)
        doc["machine"], doc["command"] = machine_facts(), current_command()
        if results is not None:
            samples = {f"{n} cold": [r["first_cmd_s"] for r in rs if r["cold"]] for n, rs in doc["samples"].items()}
            samples.update({f"{n} warm": [r["first_cmd_s"] for r in rs if not r["cold"]] for n, rs in doc["samples"].items()})
            doc["files"] = write_results(results, doc, title="containerd baselines", init_samples=samples)
        emit(doc, as_json, lambda d: _human_baselines(d))

    app.add_typer(corpus_app, name="corpus")


def _human_baselines(doc: dict[str, Any]) -> None:
    from rollstack_bench.report import markdown_table, INIT_COLUMNS
    from rollstack.cli.output import stdout

    st = doc["stack"]
    stdout.print(f"stack {st['name']}: {st['bytes'] / 1e6:.0f} MB, {st['files']} files; link {doc['link']}")
    stdout.print(markdown_table(doc["systems"], INIT_COLUMNS + [("cold_bytes_pulled", "cold bytes pulled", ",d")]))
    stdout.print(f"command: {doc['command']}")


def _emit(root: Path, manifest: CorpusManifest, as_json: bool) -> None:
    from rollstack.cli.output import emit

    doc = {"path": str(root), **manifest.model_dump(), "stacks": stack_summary(manifest)}
    emit(doc, as_json, _human)
