"""`Counters`: the node's monotonic event counts (`<name>_total` in /metrics), safe to bump from
the request threads, the reaper and the provisioner's callbacks at once (`d[k] += 1` on a plain
dict is a read and a write: two threads can lose an increment between them)."""

from __future__ import annotations

import threading
from typing import Iterable


class Counters:
    def __init__(self, names: Iterable[str]) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(names, 0)

    def bump(self, name: str, n: int = 1) -> None:
        """Add `n` to the counter `name` (KeyError for a name not declared at construction)."""
        with self._lock:
            if name not in self._values:
                raise KeyError(name)
            self._values[name] += n

    def __getitem__(self, name: str) -> int:
        with self._lock:
            return self._values[name]

    def snapshot(self) -> dict[str, int]:
        """A consistent copy of every counter."""
        with self._lock:
            return dict(self._values)
