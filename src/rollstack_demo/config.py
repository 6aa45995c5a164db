"""`DemoConfig`: what one demo run does, as one explicit value object (no globals)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rollstack.errors import InvalidRequest

DEFAULT_ROOT = Path("/var/lib/rollstack/demo")


def _stderr(msg: str) -> None:
    import sys

    print(f"[demo] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class DemoConfig:
    store: str | None = None
    """Artifact store spec (`oci:PATH`, a path, `http(s)://...`); None: $ROLLSTACK_STORE or the default."""
    root: Path = DEFAULT_ROOT
    """The demo node's state directory (environments, lazy store, caches) and the publish cache."""
    tasks: int = 4
    """How many of the corpus's tasks to run (the small corpus has 4)."""
    rollouts: int = 4
    """Rollouts per task."""
    concurrency: int = 4
    """Rollouts in flight at once."""
    corpus_dir: Path | None = None
    """The small corpus's directory; None: the corpus builder's cache (`<cache>/small`)."""
    build_corpus: bool = True
    """Build the corpus when it is missing or stale (False: it must already be built)."""
    node_dir: Path | None = None
    """The node's state directory (lazy store chunk cache included); None: `<root>/node`."""
    background_fill: bool = False
    """The plans' `fetch.background` (fill the rest of the stack after ready); see plans.rollout_plan."""
    exec_timeout: float = 300.0
    """Seconds each agent command may run."""
    log: Callable[[str], None] = field(default=_stderr, compare=False, repr=False)
    """Progress lines (stderr by default; stdout stays for the table or the JSON document)."""

    def __post_init__(self) -> None:
        for name in ("tasks", "rollouts", "concurrency"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidRequest(f"--{name} must be a positive integer, not {value!r}")
        if self.tasks > 1000 or self.rollouts > 1000 or self.concurrency > 64:
            raise InvalidRequest("--tasks/--rollouts at most 1000, --concurrency at most 64")
        if self.exec_timeout <= 0:
            raise InvalidRequest("exec timeout must be positive")

    @property
    def publish_cache(self) -> Path:
        """Where the publish cache remembers which corpus build each group was made from."""
        return self.root / "published.json"

    @property
    def node_root(self) -> Path:
        return self.node_dir if self.node_dir is not None else self.root / "node"

    @property
    def scratch(self) -> Path:
        """Layer conversion work space (on the root's disk: blobs can be hundreds of MB)."""
        return self.root / "scratch"
