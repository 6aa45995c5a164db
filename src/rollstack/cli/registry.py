"""`rollstack registry ...` commands: run a real OCI registry (Debian's docker-registry)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import typer

from rollstack.cli.output import emit

app = typer.Typer(no_args_is_help=True, help="registry commands")

DEFAULT_ROOT = Path("~/.local/share/rollstack/registry")


@app.command("serve")
def serve(
    addr: str = typer.Option("127.0.0.1:5000", "--addr", help="HOST:PORT to listen on (port 0: a free one)."),
    root: Path = typer.Option(DEFAULT_ROOT, "--root", help="Directory for the registry's data, config and log."),
    as_json: bool = typer.Option(False, "--json", help="Print {url, root, pid} as JSON once serving."),
) -> None:
    """Run docker-registry in the foreground with a generated config; Ctrl-C stops it."""
    from rollstack.store.server import RegistryServer

    server = RegistryServer(root.expanduser(), addr, die_with_parent=True)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        server.start()
        doc = {"url": server.url, "root": str(server.root), "pid": server.process.pid if server.process else None,
               "log": str(server.log_path)}
        emit(doc, as_json, lambda d: print(f"registry serving at {d['url']} (data in {d['root']}, log {d['log']}); Ctrl-C stops it",
                                           file=sys.stderr, flush=True))
        code = server.wait()
        if code:
            print(f"error: registry_unavailable: docker-registry exited with status {code} (see {server.log_path})",
                  file=sys.stderr)
            raise typer.Exit(1)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous)
