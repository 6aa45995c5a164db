"""When and how long the registry client waits before trying again (pure).

Retried: connection errors, timeouts, 429 and 5xx answers (except 501, which never heals).
Bounded twice: at most `retries` extra attempts and never past `deadline` seconds after the
first attempt, so a dead registry becomes `RegistryUnavailable` in bounded time, not a hang.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    retries: int = 4
    """Extra attempts after the first one (0: never retry)."""
    backoff: float = 0.2
    """First delay in seconds; doubles on every attempt."""
    backoff_max: float = 5.0
    """Upper bound of one delay (also caps a server's Retry-After)."""
    deadline: float = 60.0
    """No new attempt starts later than this many seconds after the first one."""
    jitter: float = 0.25
    """Random fraction added to each delay so many clients do not retry in lockstep."""

    def delay(self, attempt: int, retry_after: str | None = None, rand: float | None = None) -> float:
        """Seconds to wait before attempt number `attempt` (1 = first retry)."""
        hinted = _parse_retry_after(retry_after)
        if hinted is not None:
            return min(hinted, self.backoff_max)
        base = min(self.backoff * (2 ** (attempt - 1)), self.backoff_max)
        r = random.random() if rand is None else rand
        return min(base * (1 + self.jitter * r), self.backoff_max)

    def next_delay(self, attempt: int, elapsed: float, retry_after: str | None = None) -> float | None:
        """The wait before retry `attempt`, or None when the budget (count or deadline) is spent."""
        if attempt > self.retries:
            return None
        wait = self.delay(attempt, retry_after)
        if elapsed + wait > self.deadline:
            return None
        return wait


def is_retryable_status(status: int) -> bool:
    return status in RETRY_STATUSES


def _parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # HTTP-date form: fall back to our own backoff
