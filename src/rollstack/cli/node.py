"""`rollstack node start|stop|status`: the node agent (and its lazy store daemon)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from rollstack.cli.output import emit, stdout

app = typer.Typer(no_args_is_help=True, help="The node agent: start, stop, status.")

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
