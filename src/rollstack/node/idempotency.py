"""`IdempotencyKeys`: a create's `Idempotency-Key` -> its answer, for a bounded time.

A retried create (the client lost the answer: a reset connection, a timeout) sends the same key
and gets the same environment(s) instead of a second, orphaned one. The node remembers each key
`ttl` seconds after its create finished (and at most `max_keys` keys, oldest first):

- the same key and the same request (`fingerprint`: plan, count, lease) while the first create
  runs: the retry waits for it and gets its answer; after it: the answer at once;
- the same key with a different request: `IdempotencyConflict` (409, not retryable);
- a create that failed remembers nothing: its retry creates anew (the error may be transient).

Keys live in memory only: a node restart forgets them (its environment ids change meaning then
too: a retry across a restart creates a new environment).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from rollstack.errors import IdempotencyConflict, InvalidRequest

T = TypeVar("T")
MAX_KEY_LENGTH = 255


def check_key(key: str) -> str:
    """A key is 1-255 printable ASCII characters without spaces (E2B's keys are a subset)."""
    if not 0 < len(key) <= MAX_KEY_LENGTH or not all("!" <= c <= "~" for c in key):
        raise InvalidRequest("Idempotency-Key must be 1-255 printable ASCII characters without spaces")
    return key


def fingerprint(plan: Any, count: int | None, lease: float | None) -> str:
    """What makes two creates the same request."""
    dump = getattr(plan, "model_dump", None)
    body = dump(mode="json", exclude_none=True) if dump is not None else plan
    text = json.dumps({"plan": body, "count": count, "lease": lease}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class _Entry:
    fingerprint: str
    done: threading.Event = field(default_factory=threading.Event)
    ok: bool = False
    result: Any = None
    expires: float = float("inf")


class IdempotencyKeys:
    def __init__(self, ttl: float, max_keys: int = 65536) -> None:
        self.ttl = ttl
        self.max_keys = max_keys
        self._entries: dict[str, _Entry] = {}  # insertion order: oldest first
        self._lock = threading.Lock()

    def run(self, key: str, fingerprint: str, create: Callable[[], T]) -> T:
        """`create()` once per key (within its lifetime); every call with the key gets its answer."""
        check_key(key)
        while True:
            with self._lock:
                self._expire(time.monotonic())
                entry = self._entries.get(key)
                mine = entry is None
                if entry is None:
                    entry = self._entries[key] = _Entry(fingerprint)
            if entry.fingerprint != fingerprint:
                raise IdempotencyConflict(
                    f"Idempotency-Key {key!r} was used for a different create (plan, count or lease)")
            if mine:
                return self._first(key, entry, create)
            entry.done.wait()
            if entry.ok:
                return entry.result
            # The first attempt failed and was forgotten: this retry creates (or waits) anew.

    def _first(self, key: str, entry: _Entry, create: Callable[[], T]) -> T:
        try:
            result = create()
        except BaseException:
            with self._lock:
                if self._entries.get(key) is entry:
                    del self._entries[key]
            entry.done.set()
            raise
        entry.ok, entry.result = True, result
        entry.expires = time.monotonic() + self.ttl
        entry.done.set()
        return result

    def _expire(self, now: float) -> None:
        for key in [k for k, e in self._entries.items() if e.expires <= now]:
            del self._entries[key]
        if len(self._entries) >= self.max_keys:
            finished = [k for k, e in self._entries.items() if e.done.is_set()]
            for key in finished[: len(self._entries) - self.max_keys + 1]:
                del self._entries[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
