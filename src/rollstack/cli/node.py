"""`rollstack node start|stop|status|doctor`: the node agent (and its lazy store daemon), and
what nodes left on this host."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from rollstack.cli.output import emit, stdout

app = typer.Typer(no_args_is_help=True, help="The node agent: start, stop, status, doctor.")

RootOpt = Annotated[Optional[Path], typer.Option("--root", envvar="ROLLSTACK_ROOT", help="state directory [default: /var/lib/rollstack]")]
ListenOpt = Annotated[Optional[str], typer.Option("--listen", help="host:port [default: 127.0.0.1:7878]")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document")]


def _config(root: Path | None, listen: str | None = None, **kw: Any) -> Any:
    from rollstack.node.config import NodeConfig

    fields: dict[str, Any] = {k: v for k, v in kw.items() if v is not None}
    if root is not None:
        fields["root"] = root.absolute()
    if listen is not None:
        fields["listen"] = listen
    elif os.environ.get("ROLLSTACK_NODE"):
        fields["listen"] = os.environ["ROLLSTACK_NODE"].split("://", 1)[-1].rstrip("/")
    return NodeConfig(**fields)


@app.command("start")
def start(
    store: Annotated[Optional[str], typer.Option("--store", envvar="ROLLSTACK_STORE", help="artifact store")] = None,
    root: RootOpt = None,
    listen: ListenOpt = None,
    token_file: Annotated[Optional[Path], typer.Option("--token-file", help="bearer token file [default: ROOT/token]")] = None,
    max_environments: Annotated[Optional[int], typer.Option("--max-environments", help="admission limit")] = None,
    warm_pool: Annotated[Optional[int], typer.Option("--warm-pool", help="started sandboxes kept per stack [default: 0, off]")] = None,
    fork_warm: Annotated[Optional[int], typer.Option(
        "--fork-warm", help="late-bound sandboxes kept for forks' children once the node forked [default: 8; 0: off]")] = None,
    fork_warm_max: Annotated[Optional[int], typer.Option(
        "--fork-warm-max", help="the late-bound pool grows to the largest fork, up to this [default: 32]")] = None,
    uplink: Annotated[Optional[list[str]], typer.Option(
        "--uplink", help="host interface whose forwarding egress may switch on (repeatable) [default: those the routes to each destination use]")] = None,
    foreground: Annotated[bool, typer.Option("--foreground", help="stay attached")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Start the node agent; returns once it answers /healthz (unless --foreground)."""
    from rollstack.node import agent

    config = _config(
        root,
        listen,
        store=store,
        token_file=token_file.absolute() if token_file else None,
        max_environments=max_environments,
        warm_pool=warm_pool,
        fork_warm=fork_warm,
        fork_warm_max=fork_warm_max,
        network_uplinks=uplink or None,
    )
    if foreground:
        agent.serve(config)
        return
    doc = agent.start(config)
    emit(doc, as_json, lambda d: stdout.print(f"node agent {d['pid']} serving {d['url']} (root {d['root']})"))


@app.command("stop")
def stop(root: RootOpt = None, as_json: JsonOpt = False) -> None:
    """Stop the node agent gracefully (destroys its environments)."""
    from rollstack.node import agent

    doc = agent.stop(agent.running_config(_config(root)))
    emit(doc, as_json, lambda d: stdout.print("stopped" if d["stopped"] else "not running"))


@app.command("status")
def status(root: RootOpt = None, listen: ListenOpt = None, as_json: JsonOpt = False) -> None:
    """Whether the agent runs, and its health document."""
    from rollstack.node import agent

    config = _config(root, listen)
    doc = agent.status(config if listen else agent.running_config(config))
    emit(doc, as_json, _print_status)
    if not doc["running"]:
        raise typer.Exit(1)


def _print_status(doc: dict[str, Any]) -> None:
    if doc["running"]:
        h = doc["health"] or {}
        stdout.print(f"running: pid {doc['pid']}, {doc['url']}, {h.get('environments', 0)} environments")
    else:
        stdout.print(f"not running (root {doc['root']})")


@app.command("doctor")
def doctor(
    roots: Annotated[Optional[list[Path]], typer.Option("--root", help="a node root (repeatable) [default: $ROLLSTACK_ROOT or /var/lib/rollstack]")] = None,
    fix: Annotated[bool, typer.Option("--fix", help="reclaim what is found (never a running agent's)")] = False,
    as_json: JsonOpt = False,
) -> None:
    """What nodes left under their roots (mounts, FUSE connections, daemons, containers,
    cgroups, netns, dirs); --fix reclaims it. Exit 0 when clean (or cleaned), 1 otherwise."""
    from rollstack.errors import InvalidRequest
    from rollstack.node import doctor as doc_
    from rollstack.node.config import DEFAULT_ROOT

    chosen = [r.absolute() for r in roots or []] or [Path(os.environ.get("ROLLSTACK_ROOT") or DEFAULT_ROOT).absolute()]
    for r in chosen:
        if r.exists() and not r.is_dir():
            raise InvalidRequest(f"node root {r} is not a directory")
    facts, found = doc_.scan(chosen)
    fixed, remaining = doc_.fix(found) if fix and any(f.fixable for f in found) else ([], None)
    if fix and remaining is None:
        remaining = found
    doc = doc_.report(facts, found, fixed, remaining)
    emit(doc, as_json, _print_doctor)
    if not doc["clean"]:
        raise typer.Exit(1)


def _print_doctor(doc: dict[str, Any]) -> None:
    for r in doc["roots"]:
        extra = f", agent pid {r['pid']} at {r['url']}" if r["state"] == "running" else ""
        stdout.print(f"root {r['path']}: {r['state']}{extra}")
    for f in doc["findings"]:
        stdout.print(f"- {f['kind']} {f['target']}: {f['detail']}" + ("" if f["fixable"] else " [not fixable]"))
    for x in doc["fixed"]:
        stdout.print(f"  {'reclaimed' if x['ok'] else 'NOT reclaimed'}: {x['kind']} {x['target']}"
                     + (f" ({x['error']})" if x["error"] else ""))
    left = doc.get("remaining", doc["findings"])
    if doc["clean"]:
        stdout.print("doctor: clean" + (f" (reclaimed {len(doc['fixed'])})" if doc["fixed"] else ""))
    else:
        hint = "" if "remaining" in doc else "; --fix reclaims the fixable ones"
        stdout.print(f"doctor: {len(left)} finding(s) left{hint}")
