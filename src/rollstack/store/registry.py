"""`RegistryStore`: an OCI distribution registry over HTTP(S), spoken with a sync httpx client.

This module is the one place httpx errors become rollstack errors:

    connection error / timeout / 429 / 5xx, retries spent  -> RegistryUnavailable
    401 / 403 after one credential refresh                    -> RegistryAuthError
    404 on a blob / a manifest                                -> BlobNotFound / ManifestNotFound
    400 DIGEST_INVALID                                        -> IntegrityError
    400 MANIFEST_BLOB_UNKNOWN                                 -> BlobNotFound (ManifestNotFound for an index)
    400 *_INVALID                                             -> InvalidRequest
    anything else                                             -> RegistryError(status=...)

One `httpx.Client` (thread-safe, HTTP/1.1 keep-alive, pool sized for ~32 parallel range reads)
serves all threads. Uploads: existence check first (a blob the repository has is never sent
again), then a cross-repository mount when this client saw the blob in another repository,
else POST + PUT ?digest= (monolithic, body streamed from the file) or POST + PATCH... + PUT for
blobs larger than `chunk_size`. A failed PATCH is resumed from the offset the session reports
(GET on the upload URL); if the session is lost the whole upload starts over. Single requests
are retried individually.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, NoReturn, TypeVar

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
from rollstack.store import names
from rollstack.store.auth import TokenCache, parse_challenge
from rollstack.store.base import Manifest
from rollstack.store.retry import RetryPolicy, is_retryable_status

T = TypeVar("T")
ACCEPT_MANIFESTS = ", ".join(names.MANIFEST_TYPES)
_BLOCK = 1 << 20
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


class RegistryStore:
    """An OCI distribution registry (`http://host:port` or `https://...`). Thread-safe."""

    def __init__(
        self,
        url: str,
        *,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 30.0,
        retries: int = 4,
        retry: RetryPolicy | None = None,
        chunk_size: int = 16 << 20,
        max_connections: int = 64,
        verify: bool | str = True,
        transport: httpx.BaseTransport | None = None,
        event_hooks: dict[str, list[Callable]] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise InvalidRequest(f"registry URL must start with http:// or https://: {url!r}")
        self.url = url.rstrip("/")
        self.retry = retry or RetryPolicy(retries=retries)
        self.chunk_size = max(1, int(chunk_size))
        self.stats = RegistryStats()
        self._username, self._password = username, password
        self._use_basic = False
        self._tokens = TokenCache()
        self._holders: dict[str, str] = {}  # digest -> a repository known to hold it
        self._holders_lock = threading.Lock()
        self._sleep = sleep
        self._client = httpx.Client(
            base_url=self.url,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            follow_redirects=True,
            verify=verify,
            transport=transport,
            event_hooks=event_hooks or {},
        )

    def __repr__(self) -> str:
        return f"RegistryStore({self.url!r})"

    def __enter__(self) -> "RegistryStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    # -- blobs -------------------------------------------------------------------------------

    def has_blob(self, repo: str, digest: str) -> bool:
        return self._head_blob(repo, digest) is not None

    def blob_size(self, repo: str, digest: str) -> int:
        size = self._head_blob(repo, digest)
        if size is None:
            raise BlobNotFound(f"blob {digest} not found in {repo}", repo=repo, digest=digest)
        return size

    def read_blob(self, repo: str, digest: str, offset: int, length: int) -> bytes:
        names.check_repo(repo)
        names.check_digest(digest)
        names.check_range(offset, length)
        if length == 0:  # a zero-length Range does not exist in HTTP
            self.blob_size(repo, digest)
            return b""
        last = offset + length - 1

        def handle(resp: httpx.Response) -> bytes:
            if resp.status_code == 206:
                start = _content_range_start(resp.headers.get("content-range"))
                if start is not None and start != offset:
                    raise RegistryError(f"registry answered range from {start}, asked {offset}", status=206)
                data = resp.read()[:length]
            elif resp.status_code == 200:
                data = _slice_stream(resp.iter_bytes(), offset, length)  # server ignored Range
            elif resp.status_code == 416:
                data = b""  # offset at or past the end: the blob exists, nothing to read
            else:
                self._fail(resp, "blob", repo, digest)
            self.stats.add(bytes_read=len(data))
            return data

        data = self._request("GET", f"/v2/{repo}/blobs/{digest}", scope=repo,
                             headers={"Range": f"bytes={offset}-{last}"}, stream=True, handle=handle)
        self._remember(digest, repo)
        return data

    def put_blob(self, repo: str, digest: str, data: bytes | Path | BinaryIO) -> bool:
        names.check_repo(repo)
        names.check_digest(digest)
        with _BlobBody.open(data, digest) as body:
            if self.has_blob(repo, digest):
                return False
            start, attempt = time.monotonic(), 0
            while True:
                try:
                    uploaded = self._upload(repo, digest, body)
                    break
                except RegistryUnavailable:
                    attempt += 1
                    wait = self.retry.next_delay(attempt, time.monotonic() - start)
                    if wait is None:
                        raise
                    self.stats.add(retries=1)
                    self._sleep(wait)
        self._remember(digest, repo)
        return uploaded

    # -- manifests ---------------------------------------------------------------------------

    def put_manifest(self, repo: str, ref: str, data: bytes, media_type: str) -> str:
        names.check_repo(repo)
        names.check_ref(ref)
        names.check_manifest_type(media_type)
        digest = names.sha256_digest(data)
        if names.is_digest(ref) and ref != digest:
            raise IntegrityError(f"manifest digest {digest} != reference {ref}", digest=digest)
        blobs, children = names.manifest_references(data, media_type)
        kind = "index" if media_type in names.INDEX_MANIFEST_TYPES else "manifest"

        def handle(resp: httpx.Response) -> None:
            if resp.status_code not in (200, 201):
                self._fail(resp, kind, repo, ref)
            got = resp.headers.get("docker-content-digest")
            if got and got != digest:
                raise IntegrityError(f"registry stored manifest as {got}, expected {digest}", digest=digest)

        self._request("PUT", f"/v2/{repo}/manifests/{ref}", scope=repo,
                      headers={"Content-Type": media_type}, body=data, handle=handle)
        for d in blobs + [digest]:
            self._remember(d, repo)
        return digest

    def get_manifest(self, repo: str, ref: str) -> Manifest:
        names.check_repo(repo)
        names.check_ref(ref)

        def handle(resp: httpx.Response) -> Manifest:
            if resp.status_code != 200:
                self._fail(resp, "manifest", repo, ref)
            data = resp.content
            digest = names.sha256_digest(data)
            if names.is_digest(ref) and digest != ref:
                raise IntegrityError(f"manifest {repo}@{ref} hashes to {digest}", digest=ref)
            media_type = resp.headers.get("content-type", "").split(";", 1)[0].strip()
            return Manifest(digest=digest, media_type=media_type, data=data)

        m = self._request("GET", f"/v2/{repo}/manifests/{ref}", scope=repo, headers={"Accept": ACCEPT_MANIFESTS}, handle=handle)
        try:
            for d in names.manifest_references(m.data, m.media_type)[0]:
                self._remember(d, repo)
        except (InvalidRequest, NotFound):
            pass  # a manifest we cannot parse still is a manifest; just no mount hints
        return m

    def has_manifest(self, repo: str, ref: str) -> bool:
        names.check_repo(repo)
        names.check_ref(ref)

        def handle(resp: httpx.Response) -> bool:
            if resp.status_code == 200:
                return True
            if resp.status_code == 404:
                return False
            self._fail(resp, "manifest", repo, ref)

        return self._request("HEAD", f"/v2/{repo}/manifests/{ref}", scope=repo, headers={"Accept": ACCEPT_MANIFESTS}, handle=handle)

    def list_tags(self, repo: str) -> list[str]:
        names.check_repo(repo)
        try:
            pages = self._paginate(f"/v2/{repo}/tags/list", scope=repo, key="tags", what="repository")
        except NotFound:
            return []
        return sorted(set(pages))

    def list_repositories(self) -> list[str]:
        return sorted(set(self._paginate("/v2/_catalog", scope="", key="repositories", what="catalog")))

    # -- internals: uploads ------------------------------------------------------------------

    def _upload(self, repo: str, digest: str, body: "_BlobBody") -> bool:
        with self._holders_lock:
            holder = self._holders.get(digest)
        params = {"mount": digest, "from": holder} if holder and holder != repo else None

        def started(resp: httpx.Response) -> str | None:
            if resp.status_code == 201:
                return None  # mounted from `holder`: no bytes needed
            if resp.status_code != 202 or "location" not in resp.headers:
                self._fail(resp, "upload", repo, digest)
            return resp.headers["location"]

        location = self._request("POST", f"/v2/{repo}/blobs/uploads/", scope=repo, params=params, handle=started)
        if location is None:
            self.stats.add(mounts=1)
            return False
        if body.size > self.chunk_size:
            location = self._patch_chunks(repo, digest, body, location)
            put_headers, put_body, size = {"Content-Length": "0"}, b"", 0
        else:
            put_headers = {"Content-Type": "application/octet-stream", "Content-Length": str(body.size)}
            put_body, size = (lambda: body.iter(0, body.size)), body.size

        def finished(resp: httpx.Response) -> None:
            if resp.status_code not in (201, 204):
                self._fail(resp, "blob", repo, digest)

        self._request("PUT", self._session_url(location, digest=digest), scope=repo, retry=False,
                      headers=put_headers, body=put_body, handle=finished)
        self.stats.add(uploads=1, bytes_uploaded=body.size)
        return True

    def _patch_chunks(self, repo: str, digest: str, body: "_BlobBody", location: str) -> str:
        """PATCHes the blob in `chunk_size` pieces; resumes from the registry's offset after a
        transient failure (GET on the session says how much it has). Returns the last Location."""
        start, t0, attempt = 0, time.monotonic(), 0
        while start < body.size:
            n = min(self.chunk_size, body.size - start)
            try:
                location = self._request(
                    "PATCH", self._session_url(location), scope=repo, retry=False,
                    headers={"Content-Type": "application/octet-stream", "Content-Length": str(n),
                             "Content-Range": f"{start}-{start + n - 1}"},
                    body=lambda s=start, n=n: body.iter(s, n),
                    handle=lambda r: r.headers["location"] if r.status_code == 202 and "location" in r.headers
                    else self._fail(r, "upload", repo, digest),
                )
                start += n
            except RegistryUnavailable:
                attempt += 1
                wait = self.retry.next_delay(attempt, time.monotonic() - t0)
                if wait is None:
                    raise
                self.stats.add(retries=1)
                self._sleep(wait)
                location, start = self._session_status(repo, digest, location)
        return location

    def _session_status(self, repo: str, digest: str, location: str) -> tuple[str, int]:
        """(Location, bytes the registry holds) of an upload session; RegistryUnavailable if lost."""

        def handle(resp: httpx.Response) -> tuple[str, int]:
            if resp.status_code != 204:
                # the session is gone: let put_blob start over with a fresh one
                raise RegistryUnavailable(f"upload session for {digest} lost (HTTP {resp.status_code})")
            # "0-N" inclusive. distribution also says "0-0" for an empty session; resuming at 0
            # when it really holds 1 byte fails its offset check and we start over: still correct.
            held = resp.headers.get("range", "0-0")
            try:
                end = int(held.rsplit("-", 1)[1])
            except ValueError:
                raise RegistryUnavailable(f"upload session for {digest}: bad Range {held!r}") from None
            return resp.headers.get("location", location), 0 if held == "0-0" else end + 1

        return self._request("GET", self._session_url(location), scope=repo, handle=handle)

    def _session_url(self, location: str, digest: str | None = None) -> httpx.URL:
        url = httpx.URL(self.url + "/").join(location)
        return url.copy_merge_params({"digest": digest}) if digest else url

    # -- internals: requests -----------------------------------------------------------------

    def _head_blob(self, repo: str, digest: str) -> int | None:
        names.check_repo(repo)
        names.check_digest(digest)

        def handle(resp: httpx.Response) -> int | None:
            if resp.status_code == 200:
                return int(resp.headers.get("content-length", "0"))
            if resp.status_code == 404:
                return None
            self._fail(resp, "blob", repo, digest)

        size = self._request("HEAD", f"/v2/{repo}/blobs/{digest}", scope=repo, handle=handle)
        if size is not None:
            self._remember(digest, repo)
        return size

    def _paginate(self, path: str, *, scope: str, key: str, what: str) -> list[str]:
        out: list[str] = []
        url: str | httpx.URL = path
        params: dict[str, Any] | None = {"n": 1000}

        def handle(resp: httpx.Response) -> tuple[list[str], str | None]:
            if resp.status_code != 200:
                self._fail(resp, what, scope, path)
            try:
                items = resp.json().get(key) or []
            except ValueError:
                raise RegistryError(f"registry sent invalid JSON for {path}", status=200) from None
            return [str(i) for i in items], resp.links.get("next", {}).get("url")

        for _ in range(100_000):  # a registry looping its Link header must not loop us forever
            items, nxt = self._request("GET", url, scope=scope, params=params, handle=handle)
            out.extend(items)
            if not nxt:
                break
            url, params = httpx.URL(self.url + "/").join(nxt), None
        return out

    def _request(
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
                request = self._client.build_request(method, url, headers=hdrs, params=params, content=content)
                resp = self._client.send(request, stream=stream)
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
            self._sleep(wait)

    def _authorize(self, headers: dict[str, str], scope: str) -> None:
        token = self._tokens.get(scope)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        elif self._use_basic and self._username is not None:
            headers["Authorization"] = _basic(self._username, self._password or "")

    def _refresh_auth(self, resp: httpx.Response, scope: str) -> bool:
        """Reacts to a 401/403: fetch a fresh token or switch on basic auth; False if hopeless."""
        had_token = self._tokens.get(scope) is not None
        self._tokens.drop(scope)
        challenge = parse_challenge(resp.headers.get("www-authenticate"))
        if challenge is None:
            return had_token  # 403 with a stale token: retry once without it
        if challenge.scheme == "basic":
            if self._username is None or self._use_basic:
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
        if self._username is not None:
            headers["Authorization"] = _basic(self._username, self._password or "")
        try:
            resp = self._client.get(params["realm"], params=query, headers=headers)
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

    def _fail(self, resp: httpx.Response, what: str, repo: str, ref: str) -> NoReturn:
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

    def _remember(self, digest: str, repo: str) -> None:
        with self._holders_lock:
            if len(self._holders) > 500_000:
                self._holders.clear()  # only hints for mounts: forgetting costs an upload at most
            self._holders[digest] = repo


class _BlobBody:
    """A blob's bytes that can be sent (in slices) any number of times without loading a file."""

    def __init__(self, data: bytes | None, path: Path | None, size: int, owned: Path | None = None) -> None:
        self._data, self._path, self.size, self._owned = data, path, size, owned

    @classmethod
    def open(cls, data: bytes | Path | BinaryIO, digest: str) -> "_BlobBody":
        if isinstance(data, (bytes, bytearray, memoryview)):
            data = bytes(data)
            got = names.sha256_digest(data)
            if got != digest:
                raise IntegrityError(f"blob bytes hash to {got}, not {digest}", digest=digest)
            return cls(data, None, len(data))
        if isinstance(data, (str, os.PathLike)):
            path = Path(data)
            if not path.is_file():
                raise InvalidRequest(f"no such file {path}")
            return cls(None, path, path.stat().st_size)
        if hasattr(data, "read"):
            # a stream may not be rewindable: spool it to a temp file (never to memory)
            fd, name = tempfile.mkstemp(prefix="rollstack-upload-")
            h = hashlib.sha256()
            with os.fdopen(fd, "wb") as out:
                for block in names.stream_blocks(data, _BLOCK):
                    h.update(block)
                    out.write(block)
            path = Path(name)
            if "sha256:" + h.hexdigest() != digest:
                path.unlink(missing_ok=True)
                raise IntegrityError(f"blob bytes hash to sha256:{h.hexdigest()}, not {digest}", digest=digest)
            return cls(None, path, path.stat().st_size, owned=path)
        raise InvalidRequest(f"blob data must be bytes, a path or a binary file, not {type(data).__name__}")

    def __enter__(self) -> "_BlobBody":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._owned is not None:
            self._owned.unlink(missing_ok=True)

    def iter(self, start: int, length: int) -> Iterator[bytes] | bytes:
        if self._data is not None:
            return self._data[start:start + length]
        return self._file_slice(start, length)

    def _file_slice(self, start: int, length: int) -> Iterator[bytes]:
        assert self._path is not None
        with open(self._path, "rb") as f:
            f.seek(start)
            while length > 0:
                block = f.read(min(_BLOCK, length))
                if not block:
                    raise InvalidRequest(f"{self._path} shrank while uploading")
                length -= len(block)
                yield block


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _content_range_start(value: str | None) -> int | None:
    # "bytes 10-19/100"
    if not value or not value.startswith("bytes "):
        return None
    try:
        return int(value[6:].split("-", 1)[0])
    except ValueError:
        return None


def _slice_stream(chunks: Iterator[bytes], offset: int, length: int) -> bytes:
    """Bytes [offset, offset+length) of a full-body answer, reading no further than needed."""
    out = io.BytesIO()
    pos = 0
    for chunk in chunks:
        end = pos + len(chunk)
        if end > offset:
            out.write(chunk[max(0, offset - pos):offset + length - pos])
            if out.tell() >= length:
                break
        pos = end
    return out.getvalue()


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
