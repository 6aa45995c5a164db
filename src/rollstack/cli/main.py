"""The `rollstack` command: one sub-app per concept, one place that turns errors into one line.

Every reporting command accepts `--json` and then prints exactly one JSON document on stdout;
progress and logs go to stderr. A `RollstackError` becomes `error: <code>: <message>` on stderr
and exit status 1 (2 for usage errors); no traceback for anything a user can cause.
"""

from __future__ import annotations

import sys

import click
import typer

from rollstack.errors import RollstackError
from rollstack.cli import bench, cluster, demo, env, group, layer, node, plan, registry, volume

try:  # typer >= 0.2x vendors click: its usage errors are not `click.ClickException`s
    from typer._click.exceptions import ClickException as _TyperClickException
except ImportError:  # pragma: no cover - older typer raises click's own
    _TyperClickException = click.ClickException

app = typer.Typer(
    name="rollstack",
    help="Environment manager for agentic RL: layer groups, lazy layers, elastic quotas.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(layer.app, name="layer")
app.add_typer(registry.app, name="registry")
app.add_typer(group.app, name="group")
app.add_typer(plan.app, name="plan")
app.add_typer(node.app, name="node")
app.add_typer(env.app, name="env")
app.add_typer(volume.app, name="volume")
app.add_typer(bench.app, name="bench")
app.add_typer(cluster.app, name="cluster")
env.register_top_level(app)  # `rollstack run PLAN -- CMD`
demo.register_top_level(app)  # `rollstack demo`


def main(argv: list[str] | None = None) -> int:
    try:
        rv = app(args=argv, standalone_mode=False)
    except RollstackError as exc:
        print(f"error: {exc.code}: {exc.message or exc.code}", file=sys.stderr)
        return _exit(1)
    except click.exceptions.Exit as exc:
        return _exit(exc.exit_code)
    except (click.exceptions.Abort, typer.Abort):
        print("error: aborted", file=sys.stderr)
        return _exit(130)
    except (click.ClickException, _TyperClickException) as exc:
        exc.show()
        return _exit(exc.exit_code)
    except KeyboardInterrupt:
        return _exit(130)
    return _exit(rv if isinstance(rv, int) else 0)


def _exit(code: int) -> int:
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
