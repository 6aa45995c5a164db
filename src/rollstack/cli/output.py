"""Printing for CLI commands: one JSON document with --json, a human rendering otherwise."""

from __future__ import annotations

import json
import sys
from typing import Any, Callable

from rich.console import Console

stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False)


def emit(doc: Any, as_json: bool, human: Callable[[Any], None] | None = None) -> None:
    """Print `doc` as exactly one JSON document (as_json) or through `human`."""
    if as_json or human is None:
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
        sys.stdout.flush()
    else:
        human(doc)
