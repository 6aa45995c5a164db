"""The registry client's wire: one httpx client, auth, retries, and the error translation.

This module is the one place httpx errors and HTTP answers become rollstack errors:

    connection error / timeout / 429 / 5xx, retries spent  -> RegistryUnavailable
    401 / 403 after one credential refresh                    -> RegistryAuthError
    404 on a blob / a manifest                                -> BlobNotFound / ManifestNotFound
    400 DIGEST_INVALID                                        -> IntegrityError
    400 MANIFEST_BLOB_UNKNOWN                                 -> BlobNotFound (ManifestNotFound for an index)
    400 *_INVALID                                             -> InvalidRequest
    anything else                                             -> RegistryError(status=...)

`RegistryWire.request` sends one logical request: it adds credentials (a cached bearer token
or basic auth), refreshes them once on 401/403 (the `WWW-Authenticate` flow of `store.auth`),
retries transport errors and retryable statuses under a `RetryPolicy`, and hands any other
answer to a `handle` callback, whose typed errors pass through and whose transport errors
(a body cut short) are retried too. The client is thread-safe: HTTP/1.1 keep-alive, a pool
large enough for ~32 parallel range reads.
"""

from __future__ import annotations

import base64
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, NoReturn, TypeVar

import httpx

from rollstack.errors import (
    BlobNotFound,
    IntegrityError,
    InvalidRequest,
    ManifestNotFound,
    NotFound,
    RegistryAuthError,
    RegistryError,
    RegistryUnavailable,
)
from rollstack.store.auth import TokenCache, parse_challenge
from rollstack.store.retry import RetryPolicy, is_retryable_status

T = TypeVar("T")
_INVALID_CODES = {"MANIFEST_INVALID", "NAME_INVALID", "TAG_INVALID", "SIZE_INVALID", "MANIFEST_UNVERIFIED", "UNSUPPORTED", "DIGEST_INVALID"}


@dataclass
class RegistryStats:
    """Counters of what this client sent (for tests, benchmarks and `fetched_bytes`)."""

    requests: Counter = field(default_factory=Counter)  # by HTTP method
    bytes_read: int = 0
    bytes_uploaded: int = 0
    uploads: int = 0
    mounts: int = 0
    retries: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for k, v in counts.items():
                setattr(self, k, getattr(self, k) + v)

    def request(self, method: str) -> None:
        with self._lock:
            self.requests[method] += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": dict(self.requests),
                "bytes_read": self.bytes_read,
                "bytes_uploaded": self.bytes_uploaded,
                "uploads": self.uploads,
                "mounts": self.mounts,
                "retries": self.retries,
            }


class RegistryWire:
    """HTTP to one registry: `request()` with auth + retries, `fail()` for typed errors."""

    def __init__(
        self,
        url: str,
        *,
        username: str | None,
        password: str | None,
        timeout: float,
        retry: RetryPolicy,
        max_connections: int,
        verify: bool | str,
        transport: httpx.BaseTransport | None,
        event_hooks: dict[str, list[Callable]] | None,
        sleep: Callable[[float], None],
    ) -> None:
        self.url = url
        self.retry = retry
        self.sleep = sleep
        self.stats = RegistryStats()
        self.username, self.password = username, password
        self._use_basic = False
        self._tokens = TokenCache()
        self.client = httpx.Client(
            base_url=url,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            follow_redirects=True,
            verify=verify,
            transport=transport,
            event_hooks=event_hooks or {},
        )

    def close(self) -> None:
        self.client.close()

    def session_url(self, location: str, digest: str | None = None) -> httpx.URL:
        """An upload session's Location (absolute or relative), its `_state` query kept."""
        url = httpx.URL(self.url + "/").join(location)
        return url.copy_merge_params({"digest": digest}) if digest else url

    def request(
        self,
        method: str,
        url: str | httpx.URL,
        *,
        scope: str,
        handle: Callable[[httpx.Response], T],
        headers: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
        body: bytes | Callable[[], Any] | None = None,
        stream: bool = False,
        retry: bool = True,
    ) -> T:
        """Sends one request with auth, retries and error translation; `handle` reads the answer.

        `body` may be a callable producing a fresh body per attempt (streamed file slices).
        Transport errors inside `handle` (a body read cut short) are retried like any other."""
        start, attempt, refreshed = time.monotonic(), 0, False
        while True:
            hdrs = dict(headers or {})
            self._authorize(hdrs, scope)
            content = body() if callable(body) else body
            resp = None
            try:
                request = self.client.build_request(method, url, headers=hdrs, params=params, content=content)
                resp = self.client.send(request, stream=stream)
                self.stats.request(method)
                status = resp.status_code
                if status in (401, 403) and not refreshed and self._refresh_auth(resp, scope):
                    refreshed = True
                    continue
                if status in (401, 403):
                    raise RegistryAuthError(f"registry {self.url} refused {method} {url}: HTTP {status} {_error_text(resp)}",
                                            status=status)
                if is_retryable_status(status):
                    wait = self.retry.next_delay(attempt + 1, time.monotonic() - start, resp.headers.get("retry-after")) if retry else None
                    if wait is None:
                        raise RegistryUnavailable(f"registry {self.url} answered HTTP {status} to {method} {url}: {_error_text(resp)}",
                                                  status=status, url=self.url)
                else:
                    return handle(resp)
            except httpx.TransportError as exc:
                wait = self.retry.next_delay(attempt + 1, time.monotonic() - start) if retry else None
                if wait is None:
                    raise RegistryUnavailable(f"registry {self.url} unreachable ({method} {url}): {type(exc).__name__}: {exc}",
                                              url=self.url) from None
            finally:
                if resp is not None:
                    resp.close()
            attempt += 1
            self.stats.add(retries=1)
            self.sleep(wait)

    def _authorize(self, headers: dict[str, str], scope: str) -> None:
        token = self._tokens.get(scope)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        elif self._use_basic and self.username is not None:
            headers["Authorization"] = _basic(self.username, self.password or "")

    def _refresh_auth(self, resp: httpx.Response, scope: str) -> bool:
        """Reacts to a 401/403: fetch a fresh token or switch on basic auth; False if hopeless."""
        had_token = self._tokens.get(scope) is not None
        self._tokens.drop(scope)
        challenge = parse_challenge(resp.headers.get("www-authenticate"))
        if challenge is None:
            return had_token  # 403 with a stale token: retry once without it
        if challenge.scheme == "basic":
            if self.username is None or self._use_basic:
                return False
            self._use_basic = True
            return True
        if challenge.scheme != "bearer" or "realm" not in challenge.params:
            return False
        self._tokens.put(scope, *self._fetch_token(challenge.params, challenge.scopes))
        return True

    def _fetch_token(self, params: dict[str, str], scopes: list[str]) -> tuple[str, float | None]:
        query: list[tuple[str, str]] = []
        if params.get("service"):
            query.append(("service", params["service"]))
        query.extend(("scope", s) for s in scopes)
        headers = {}
        if self.username is not None:
            headers["Authorization"] = _basic(self.username, self.password or "")
        try:
            resp = self.client.get(params["realm"], params=query, headers=headers)
        except httpx.TransportError as exc:
            raise RegistryUnavailable(f"token server {params['realm']} unreachable: {exc}", url=params["realm"]) from None
        self.stats.request("GET")
        if resp.status_code != 200:
            raise RegistryAuthError(f"token server {params['realm']} answered HTTP {resp.status_code}", status=resp.status_code)
        try:
            doc = resp.json()
            token = doc.get("token") or doc.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not token:
            raise RegistryAuthError(f"token server {params['realm']} sent no token")
        return str(token), doc.get("expires_in")

    def fail(self, resp: httpx.Response, what: str, repo: str, ref: str) -> NoReturn:
        """Raises the typed error for an unexpected answer (the one translation point)."""
        status, text = resp.status_code, _error_text(resp)
        codes = _error_codes(resp)
        where = f"{repo}@{ref}" if ref.startswith("sha256:") else f"{repo}:{ref}"
        if status == 404:
            if what == "blob":
                raise BlobNotFound(f"blob {ref} not found in {repo}", repo=repo, digest=ref)
            if what in ("manifest", "index"):
                raise ManifestNotFound(f"manifest {where} not found", repo=repo, ref=ref)
            raise NotFound(f"{what} {repo} not found: {text}", repo=repo)
        if "DIGEST_INVALID" in codes:
            raise IntegrityError(f"registry rejected {where}: content does not match digest ({text})", digest=ref)
        if "MANIFEST_BLOB_UNKNOWN" in codes or "BLOB_UNKNOWN" in codes:
            if what == "index":
                raise ManifestNotFound(f"index {where} references a manifest not in {repo} ({text})", repo=repo)
            raise BlobNotFound(f"manifest {where} references a blob not in {repo} ({text})", repo=repo)
        if status == 400 or codes & _INVALID_CODES:
            raise InvalidRequest(f"registry rejected {where}: {text}", status=status)
        raise RegistryError(f"registry {self.url}: HTTP {status} for {what} {where}: {text}", status=status)


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _error_json(resp: httpx.Response) -> list[dict[str, Any]]:
    try:
        resp.read()
        doc = resp.json()
    except Exception:  # noqa: BLE001 - error bodies are best effort
        return []
    errors = doc.get("errors") if isinstance(doc, dict) else None
    return [e for e in errors or [] if isinstance(e, dict)]


def _error_codes(resp: httpx.Response) -> set[str]:
    return {str(e.get("code")) for e in _error_json(resp)}


def _error_text(resp: httpx.Response) -> str:
    errors = _error_json(resp)
    if errors:
        return "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors)
    try:
        resp.read()
        return resp.text[:200]
    except Exception:  # noqa: BLE001
        return ""

