"""`rollstack demo`: the main job on the embedded default store (logic in `rollstack_demo`, beside the product)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from rich.console import Console

from rollstack.cli.output import emit, stdout

_TABLE_WIDTH = 140


def register_top_level(root: typer.Typer) -> None:
    @root.command("demo")
    def demo(
        store: Optional[str] = typer.Option(None, "--store", envvar="ROLLSTACK_STORE",
                                            help="store spec (oci:PATH, a path, http://host:port) [default: the embedded store]"),
        root_dir: Path = typer.Option(Path("/var/lib/rollstack/demo"), "--root",
                                      help="the demo node's state directory and publish cache"),
        tasks: int = typer.Option(4, "--tasks", min=1, help="tasks to run (the small corpus has 4)"),
        rollouts: int = typer.Option(4, "--rollouts", min=1, help="rollouts per task"),
        concurrency: int = typer.Option(4, "--concurrency", min=1, max=64, help="rollouts in flight at once"),
        corpus: Optional[Path] = typer.Option(None, "--corpus", help="small corpus directory [default: the corpus cache]"),
        no_build: bool = typer.Option(False, "--no-build", help="do not build the corpus; fail if it is not built"),
        background_fill: bool = typer.Option(False, "--background-fill",
                                             help="plans fill the rest of the stack in the background after ready"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
    ) -> None:
        """Build a small real corpus (cached), publish it, run rollouts on an in-process node, print a table."""
        from rollstack_demo.config import DemoConfig
        from rollstack_demo.runner import run_demo

        doc = run_demo(DemoConfig(store=store, root=root_dir, tasks=tasks, rollouts=rollouts,
                                  concurrency=concurrency, corpus_dir=corpus, build_corpus=not no_build,
                                  background_fill=background_fill))
        emit(doc, as_json, _human)
        if not doc["ok"]:
            raise typer.Exit(1)


def _human(doc: dict[str, Any]) -> None:
    from rollstack_demo.report import RolloutRecord, StepResult, human_bytes, rich_table, summary_lines

    stdout.print(f"store {doc['store']}  corpus {doc['corpus']['path']} ({doc['corpus']['tasks']} tasks)")
    for g in doc["groups"]:
        state = "cached" if g["cached"] else f"uploaded {human_bytes(g['uploaded_bytes'])}"
        stdout.print(f"  {g['group']:<32} {human_bytes(g['tree_bytes']):>10} files -> "
                     f"{human_bytes(g['size']):>10} layer  {g['digest'][:19]}  {state}")
    records = []
    for r in doc["rollouts"]:
        steps = {k: StepResult(**r[k]) if r.get(k) else None for k in ("test_before", "fix", "test_after")}
        fields = {k: v for k, v in r.items() if k in RolloutRecord.__dataclass_fields__}
        records.append(RolloutRecord(**{**fields, **steps}))
    c = doc["config"]
    table = rich_table(records, f"{c['tasks']} tasks x {c['rollouts']} rollouts, {c['concurrency']} at a time "
                                f"(seconds; fetched = bytes pulled before the environment was ready)")
    # A pipe or file gets the whole table (rich would squeeze it to 80 columns); a terminal its width.
    out = stdout if stdout.is_terminal else Console(highlight=False, soft_wrap=True, width=_TABLE_WIDTH)
    out.print(table)
    for r in records:
        if r.error:
            stdout.print(f"  {r.task} #{r.rollout}: {r.error}")
    for line in summary_lines(doc["summary"], doc["stages"]):
        stdout.print(line)
    rs, m, nm = doc["rollout_stack"], doc["machine"], doc.get("node", {}).get("metrics", {})
    if "lazy_fetch_transferred_bytes_registry" in nm:
        pulled = nm["lazy_fetch_transferred_bytes_registry"]
        share = f" ({100 * pulled / rs['layer_bytes']:.1f}% of the rollout stack's layers)" if rs["layer_bytes"] else ""
        stdout.print(f"the node pulled {human_bytes(pulled)} from the store over the whole run{share} in "
                     f"{nm.get('lazy_fetch_requests_registry', 0):.0f} requests; its chunk cache holds "
                     f"{human_bytes(nm.get('lazy_disk_cache_bytes'))}; {nm.get('created_total', 0):.0f} environments "
                     f"created (evaluators included), {nm.get('execs_total', 0):.0f} execs")
    stdout.print(f"rollout stack {' + '.join(rs['groups'])}: {human_bytes(rs['files_bytes'])} of files in "
                 f"{human_bytes(rs['layer_bytes'])} of layers; machine: {m['cpus']} cpus, load average "
                 f"{m['loadavg_start'][0]:.1f} at start, {m['loadavg_end'][0]:.1f} at end")
    left = {k: v for k, v in doc["leftovers"].items() if v}
    stdout.print("leftovers after stop: " + ("none (mounts, env dirs, runc state, cgroups, processes)"
                                             if not left else str(left)))
