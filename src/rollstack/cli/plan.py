"""`rollstack plan ...`: validate a plan and resolve it to its layer stack."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from rollstack.cli.output import emit, stdout

app = typer.Typer(no_args_is_help=True, help="Environment plans: resolve, check, publish, ls.")

STORE_HELP = "oci:PATH, a path, or http(s)://host:port (default: $ROLLSTACK_STORE or ~/.local/share/rollstack/store)"


@app.command("resolve")
def resolve(
    plan: Path = typer.Argument(..., metavar="PLAN", help="plan file (YAML or JSON), or a published NAME:TAG"),
    store: Optional[str] = typer.Option(None, "--store", envvar="ROLLSTACK_STORE", help="oci:PATH, a path, or http(s)://host:port"),
    ttl: float = typer.Option(60.0, "--ttl", help="seconds a cached tag resolution stays fresh"),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="resolution cache (default: ~/.cache/rollstack)"),
    no_cache: bool = typer.Option(False, "--no-cache", help="ask the store for every reference"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """The layer stack, bottom first: each layer's digest, size and the group it came from."""
    from rollstack.plan.resolve import Resolver, default_cache_dir
    from rollstack.store import open_store

    st = open_store(store)
    try:
        p = _load(plan, st)
        resolver = Resolver(st, None if no_cache else (cache_dir or default_cache_dir()), ttl=0.0 if no_cache else ttl)
        stack = resolver.resolve(p)
    finally:
        st.close()
    doc = {"plan": p.name, **stack.to_dict(), "seconds": round(stack.seconds, 6), "store": st.url}

    def human(d: dict[str, Any]) -> None:
        for i, layer in enumerate(d["layers"]):
            stdout.print(f"{i:3d}  {layer['digest']}  {layer['size']:>12d}  {layer['group']}")
        stdout.print(f"stack {d['stack_digest']}  {len(d['layers'])} layers  {d['size']} bytes")
        if "evaluator" in d:
            ev = d["evaluator"]
            stdout.print(f"evaluator stack {ev['stack_digest']}  {len(ev['layers'])} layers  {ev['size']} bytes")

    emit(doc, as_json, human)


def _load(plan: Path, store: Any) -> Any:
    """A plan file, or (a string that is no file, spelled NAME[:TAG]) a published plan."""
    from rollstack.plan.model import load_plan
    from rollstack.plan.published import is_plan_ref, load_published

    return load_published(store, str(plan)) if is_plan_ref(str(plan)) else load_plan(plan)


@app.command("check")
def check(
    plan: Path = typer.Argument(..., metavar="PLAN", help="plan file (YAML or JSON)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document (the normalised plan)"),
) -> None:
    """Validate PLAN (exit 1 with `plan_invalid: <field>: <reason>` if it is not valid)."""
    from rollstack.plan.model import load_plan

    p = load_plan(plan)
    emit(p.model_dump(mode="json"), as_json, lambda d: stdout.print(f"{p.name}: valid, {len(p.groups)} group(s)"))


@app.command("publish")
def publish(
    name_tag: str = typer.Argument(..., metavar="NAME:TAG", help="e.g. tasks/attrs-0042:1 (an E2B templateID)"),
    plan: Path = typer.Argument(..., metavar="PLAN_FILE", help="plan file (YAML or JSON); its mutation file is stored inline"),
    store: Optional[str] = typer.Option(None, "--store", envvar="ROLLSTACK_STORE", help=STORE_HELP),
    created: Optional[str] = typer.Option(None, "--created", help="creation time to record (default: now); fixes the manifest digest"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Store PLAN_FILE (with its mutation diff and evaluator) as NAME:TAG; `NAME:TAG` is then
    accepted wherever a plan is (env create, run, the SDK, E2B's templateID)."""
    from rollstack.plan.published import publish_plan
    from rollstack.store import open_store

    st = open_store(store)
    try:
        info = publish_plan(st, name_tag, plan, created=created)
    finally:
        st.close()
    doc = {**info.to_dict(), "store": st.url}
    emit(doc, as_json, lambda d: stdout.print(
        f"{d['name']}:{d['tag']}  {d['digest']}" + ("  (unchanged)" if d["unchanged"] else "")))


@app.command("ls")
def ls(
    store: Optional[str] = typer.Option(None, "--store", envvar="ROLLSTACK_STORE", help=STORE_HELP),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Published plans (templates): name, tag, digest, plan name, groups."""
    from rollstack.plan.published import list_plans
    from rollstack.store import open_store

    st = open_store(store)
    try:
        plans = list_plans(st)
    finally:
        st.close()
    doc = {"plans": [p.to_dict() for p in plans], "store": st.url}

    def human(d: dict[str, Any]) -> None:
        for p in d["plans"]:
            extra = " ".join(x for x, on in (("mutation", p["has_mutation"]), ("evaluator", p["has_evaluator"])) if on)
            stdout.print(f"{p['name']}:{p['tag']}  {p['digest'][:19]}  {p['plan_name']}  "
                         f"{len(p['groups'])} group(s)  {extra}".rstrip())

    emit(doc, as_json, human)
