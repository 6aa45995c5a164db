"""Registry authentication pieces (pure): `WWW-Authenticate` parsing and the token cache.

The standard distribution flow: a request answered 401 carries
`WWW-Authenticate: Bearer realm="https://auth/token",service="registry",scope="repository:x:pull"`;
the client asks the realm for a token (with basic credentials if it has any) and repeats the
request with `Authorization: Bearer <token>`. `Basic realm=...` means plain basic auth.
Tokens are cached per repository (the unit a scope names) and dropped on the next 401.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass

_PARAM_RE = re.compile(r'([A-Za-z][A-Za-z0-9_-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))')


@dataclass(frozen=True, slots=True)
class Challenge:
    scheme: str  # lower case: "bearer" or "basic"
    params: dict[str, str]

    @property
    def scopes(self) -> list[str]:
        """The scope parameter may hold several space-separated scopes."""
        return [s for s in self.params.get("scope", "").split(" ") if s]


def parse_challenge(header: str | None) -> Challenge | None:
    """The first challenge of a `WWW-Authenticate` header (None if absent or unparsable)."""
    if not header:
        return None
    header = header.strip()
    scheme, _, rest = header.partition(" ")
    if not scheme:
        return None
    params = {m.group(1).lower(): (m.group(2) if m.group(2) is not None else m.group(3)).replace('\\"', '"') for m in _PARAM_RE.finditer(rest)}
    return Challenge(scheme=scheme.lower(), params=params)


@dataclass(slots=True)
class Token:
    value: str
    expires_at: float  # time.monotonic() deadline


class TokenCache:
    """Bearer tokens keyed by repository ("" for registry-wide calls such as _catalog)."""

    def __init__(self, clock=time.monotonic) -> None:
        self._tokens: dict[str, Token] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def get(self, key: str) -> str | None:
        with self._lock:
            tok = self._tokens.get(key)
            if tok is None:
                return None
            if tok.expires_at <= self._clock():
                del self._tokens[key]
                return None
            return tok.value

    def put(self, key: str, value: str, expires_in: float | None) -> None:
        # refresh a little early so a token does not expire in flight
        ttl = max(1.0, float(expires_in or 60) - 5.0)
        with self._lock:
            self._tokens[key] = Token(value, self._clock() + ttl)

    def drop(self, key: str) -> None:
        with self._lock:
            self._tokens.pop(key, None)
