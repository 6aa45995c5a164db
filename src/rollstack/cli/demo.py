"""`rollstack demo`: the main job on the embedded default store."""

from __future__ import annotations

import typer


def register_top_level(root: typer.Typer) -> None:
    @root.command("demo")
    def demo() -> None:
        """Build a small real corpus, publish it, run rollouts, print a table."""
