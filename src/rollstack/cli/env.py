"""`rollstack env ...` commands."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, help="env commands")


def register_top_level(root: typer.Typer) -> None:
    """Adds `rollstack run PLAN -- CMD...` to the root app."""
