"""`rollstack volume ...`: the node's volumes (docs/node.md "Volumes"), through the SDK's `Client`.

Every command takes `--node` (env ROLLSTACK_NODE) and `--token` (env ROLLSTACK_TOKEN), as
`rollstack env` does. A plan mounts a volume with `volumes: [{name, path, read_only, exclusive}]`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from rollstack.cli.env import JsonOpt, NodeOpt, TokenOpt, node_client
from rollstack.cli.output import emit, stdout

app = typer.Typer(no_args_is_help=True, help="Volumes of a node agent: create, ls, rm, put, get.")
Name = Annotated[str, typer.Argument(metavar="NAME", help="the volume's name")]


@app.command("create")
def create(name: Name, node: NodeOpt = None, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """A new, empty volume."""
    with node_client(node, token) as client:
        doc = client.create_volume(name).model_dump(mode="json")
    emit(doc, as_json, lambda d: stdout.print(d["name"]))


@app.command("ls")
def ls(node: NodeOpt = None, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """The node's volumes and the environments mounting each."""
    with node_client(node, token) as client:
        vols = [v.model_dump(mode="json") for v in client.volumes()]
    emit({"volumes": vols}, as_json, _print_list)


def _print_list(doc: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table("name", "mounted by")
    for v in doc["volumes"]:
        table.add_row(v["name"], " ".join(v["mounted_by"]))
    stdout.print(table)


@app.command("rm")
def rm(names: Annotated[list[str], typer.Argument(metavar="NAME...")], node: NodeOpt = None,
       token: TokenOpt = None) -> None:
    """Remove volumes and their files (volume_busy while an environment mounts one)."""
    with node_client(node, token) as client:
        for name in names:
            client.delete_volume(name)


@app.command("put")
def put(name: Name, src: Annotated[Path, typer.Argument(metavar="FILE", help="a local file, - for stdin")],
        dst: Annotated[str, typer.Argument(metavar="PATH", help="its path in the volume")],
        node: NodeOpt = None, token: TokenOpt = None) -> None:
    """Write a file into the volume (parents made)."""
    data = sys.stdin.buffer.read() if str(src) == "-" else src.read_bytes()
    with node_client(node, token) as client:
        client.write_volume_file(name, dst, data)


@app.command("get")
def get(name: Name, path: Annotated[str, typer.Argument(metavar="PATH", help="a file's path in the volume")],
        node: NodeOpt = None, token: TokenOpt = None) -> None:
    """A file of the volume, to stdout."""
    with node_client(node, token) as client:
        data = client.read_volume_file(name, path)
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
