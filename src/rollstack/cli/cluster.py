"""`rollstack cluster up|status|down|gateway`: node agents on a Ray cluster, as one pool."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from rollstack.cli.output import emit, stdout

app = typer.Typer(no_args_is_help=True, help="Node agents on a Ray cluster: up, status, down, gateway.")

AddressOpt = Annotated[Optional[str], typer.Option("--address", envvar="RAY_ADDRESS", help="Ray head HOST:PORT")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document")]


@app.command("up")
def up(
    store: Annotated[str, typer.Option("--store", envvar="ROLLSTACK_STORE", help="artifact store every node uses")],
    address: AddressOpt = None,
    root: Annotated[Optional[Path], typer.Option("--root", help="base of the node roots [default: /var/lib/rollstack/cluster]")] = None,
    max_environments: Annotated[Optional[int], typer.Option("--max-environments", help="admission limit per node")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Start a node agent on every Ray node that carries the custom resource `rollstack`."""
    from rollstack.cluster.control import up as cluster_up

    options: dict[str, Any] = {}
    if max_environments is not None:
        options["max_environments"] = max_environments
    doc = cluster_up(address, store, root=root, options=options)
    emit(doc, as_json, _print_nodes)


@app.command("status")
def status(address: AddressOpt = None, as_json: JsonOpt = False) -> None:
    """Every node: URL, state, environments, capacity left, hot stacks."""
    from rollstack.cluster.control import status as cluster_status

    doc = cluster_status(address)
    emit(doc, as_json, _print_status)


@app.command("down")
def down(address: AddressOpt = None, as_json: JsonOpt = False) -> None:
    """Stop every node agent (destroys their environments; removes their roots)."""
    from rollstack.cluster.control import down as cluster_down

    doc = cluster_down(address)
    emit(doc, as_json, lambda d: stdout.print(f"stopped {len(d['stopped'])} node agent(s)"))


@app.command("gateway")
def gateway(
    listen: Annotated[str, typer.Option("--listen", help="host:port to serve the node API on")] = "127.0.0.1:7879",
    address: AddressOpt = None,
) -> None:
    """Serve the node HTTP API for the whole pool (creates placed, other calls forwarded)."""
    from rollstack.cluster.gateway import serve

    serve(address, listen)


def _print_nodes(doc: dict[str, Any]) -> None:
    for n in doc["nodes"]:
        stdout.print(f"{n['node_id']}: {n['url']} ({n['state']}, root {n['root']})")


def _print_status(doc: dict[str, Any]) -> None:
    for n in doc["nodes"]:
        stdout.print(f"{n['node_id']}: {n['url']} {n['state']}, {n['environments']} environments, "
                     f"free {n['free']}, {len(n['hot_stacks'])} hot stacks")
