"""`RegistryStore`: an OCI distribution registry over HTTP(S), spoken with a sync httpx client.

The store operations live here; the wire (one thread-safe httpx client, bearer/basic auth,
retries with backoff, and the one translation of httpx errors and HTTP answers into rollstack
errors: RegistryUnavailable, RegistryAuthError, BlobNotFound, ManifestNotFound, IntegrityError,
InvalidRequest, RegistryError) lives in `store.wire`.

Reads: HEAD for existence and size; GET with `Range: bytes=a-b` (a 206 is checked, a 200 full
body is sliced while streaming, 416 means past the end); several ranges in one GET
(`read_ranges`, multipart/byteranges) where the registry answers them. Uploads: existence check first (a blob
the repository has is never sent again), then a cross-repository mount when this client saw
the blob in another repository, else POST + PUT ?digest= (monolithic, body streamed from the
file) or POST + PATCH... + PUT for blobs larger than `chunk_size`. A failed PATCH is resumed
from the offset the session reports (GET on the upload URL); if the session is lost the whole
upload starts over. Single requests are retried individually by the wire.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable, Sequence

import httpx

from rollstack.errors import BlobNotFound, IntegrityError, InvalidRequest, NotFound, RegistryError, RegistryUnavailable
from rollstack.store import byteranges, names
from rollstack.store.base import Manifest
from rollstack.store.body import BlobBody
from rollstack.store.retry import RetryPolicy
from rollstack.store.wire import RegistryStats, RegistryWire

ACCEPT_MANIFESTS = ", ".join(names.MANIFEST_TYPES)

__all__ = ["RegistryStore", "RegistryStats", "ACCEPT_MANIFESTS"]


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
        self.chunk_size = max(1, int(chunk_size))
        self._wire = RegistryWire(
            self.url, username=username, password=password, timeout=timeout,
            retry=retry or RetryPolicy(retries=retries), max_connections=max_connections, verify=verify,
            transport=transport, event_hooks=event_hooks, sleep=sleep,
        )
        self.retry = self._wire.retry
        self.stats = self._wire.stats  # requests by method, bytes read/uploaded, uploads, mounts, retries
        self.multi_range = True  # several ranges per GET (`read_ranges`) until the registry shows otherwise
        self._holders: dict[str, str] = {}  # digest -> a repository known to hold it (mount hints)
        self._holders_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RegistryStore({self.url!r})"

    def __enter__(self) -> "RegistryStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._wire.close()

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
                start = byteranges.content_range_start(resp.headers.get("content-range"))
                if start is not None and start != offset:
                    raise RegistryError(f"registry answered range from {start}, asked {offset}", status=206)
                data = resp.read()[:length]
            elif resp.status_code == 200:
                data = byteranges.slice_stream(resp.iter_bytes(), offset, length)  # server ignored Range
            elif resp.status_code == 416:
                data = b""  # offset at or past the end: the blob exists, nothing to read
            else:
                self._wire.fail(resp, "blob", repo, digest)
            self.stats.add(bytes_read=len(data))
            return data

        data = self._wire.request("GET", f"/v2/{repo}/blobs/{digest}", scope=repo,
                                  headers={"Range": f"bytes={offset}-{last}"}, stream=True, handle=handle)
        self._remember(digest, repo)
        return data

    def read_ranges(self, repo: str, digest: str, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        """Several disjoint spans [(offset, length)] in increasing order, in one GET answered as
        `multipart/byteranges` (`store.byteranges`). A registry that ignores the ranges (200)
        or answers unparseably is marked `multi_range = False`, and the spans are read one GET
        each, now and from then on."""
        spans = [(int(o), int(n)) for o, n in spans]
        if len(spans) <= 1 or not self.multi_range:
            return [self.read_blob(repo, digest, o, n) for o, n in spans]
        if len(spans) > byteranges.MAX_SPANS:
            step = byteranges.MAX_SPANS
            return [b for i in range(0, len(spans), step) for b in self.read_ranges(repo, digest, spans[i:i + step])]
        names.check_repo(repo)
        names.check_digest(digest)
        for o, n in spans:
            names.check_range(o, n)
        header = byteranges.range_header(spans)
        cap = spans[-1][0] + spans[-1][1] - spans[0][0] + 512 * len(spans) + 4096  # covering range + part headers

        def handle(resp: httpx.Response) -> list[bytes] | None:
            if resp.status_code != 206:
                if resp.status_code not in (200, 416):
                    self._wire.fail(resp, "blob", repo, digest)
                return None  # Range ignored (never read a whole blob for it) or past the end: one GET per span
            body = byteranges.read_capped(resp, cap)
            boundary = byteranges.boundary_of(resp.headers.get("content-type"))
            try:
                if boundary is None:  # one part: the server merged the spans into one covering range
                    start = byteranges.content_range_start(resp.headers.get("content-range"))
                    if start is None:
                        raise ValueError("206 without Content-Range")
                    return byteranges.slice_spans([(start, body)], spans)
                return byteranges.parse_byteranges(body, boundary, spans)
            except ValueError:
                return None

        got = self._wire.request("GET", f"/v2/{repo}/blobs/{digest}", scope=repo, headers={"Range": header},
                                 stream=True, handle=handle)
        if got is None:
            self.multi_range = False
            return [self.read_blob(repo, digest, o, n) for o, n in spans]
        self.stats.add(bytes_read=sum(map(len, got)))
        self._remember(digest, repo)
        return got

    def put_blob(self, repo: str, digest: str, data: bytes | Path | BinaryIO) -> bool:
        names.check_repo(repo)
        names.check_digest(digest)
        with BlobBody.open(data, digest) as body:
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
                    self._wire.sleep(wait)
        self._remember(digest, repo)
        return uploaded

    # -- manifests ---------------------------------------------------------------------------

    def put_manifest(self, repo: str, ref: str, data: bytes, media_type: str) -> str:
        data, digest, blobs, children = names.check_manifest_put(repo, ref, data, media_type)
        kind = "index" if media_type in names.INDEX_MANIFEST_TYPES else "manifest"

        def handle(resp: httpx.Response) -> None:
            if resp.status_code not in (200, 201):
                self._wire.fail(resp, kind, repo, ref)
            got = resp.headers.get("docker-content-digest")
            if got and got != digest:
                raise IntegrityError(f"registry stored manifest as {got}, expected {digest}", digest=digest)

        self._wire.request("PUT", f"/v2/{repo}/manifests/{ref}", scope=repo,
                           headers={"Content-Type": media_type}, body=data, handle=handle)
        for d in blobs + [digest]:
            self._remember(d, repo)
        return digest

    def get_manifest(self, repo: str, ref: str) -> Manifest:
        names.check_repo(repo)
        names.check_ref(ref)

        def handle(resp: httpx.Response) -> Manifest:
            if resp.status_code != 200:
                self._wire.fail(resp, "manifest", repo, ref)
            data = resp.content
            digest = names.sha256_digest(data)
            if names.is_digest(ref) and digest != ref:
                raise IntegrityError(f"manifest {repo}@{ref} hashes to {digest}", digest=ref)
            media_type = resp.headers.get("content-type", "").split(";", 1)[0].strip()
            return Manifest(digest=digest, media_type=media_type, data=data)

        m = self._wire.request("GET", f"/v2/{repo}/manifests/{ref}", scope=repo, headers={"Accept": ACCEPT_MANIFESTS}, handle=handle)
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
            self._wire.fail(resp, "manifest", repo, ref)

        return self._wire.request("HEAD", f"/v2/{repo}/manifests/{ref}", scope=repo, headers={"Accept": ACCEPT_MANIFESTS}, handle=handle)

    def delete_manifest(self, repo: str, digest: str) -> None:
        """Removes the manifest and every tag pointing at it (needs `delete: enabled`)."""
        self._delete(repo, digest, "manifest", f"/v2/{repo}/manifests/{digest}")

    def delete_blob(self, repo: str, digest: str) -> None:
        """Unlinks the blob from the repository (storage is reclaimed by garbage collection)."""
        self._delete(repo, digest, "blob", f"/v2/{repo}/blobs/{digest}")
        with self._holders_lock:
            if self._holders.get(digest) == repo:
                del self._holders[digest]

    def _delete(self, repo: str, digest: str, what: str, path: str) -> None:
        names.check_repo(repo)
        names.check_digest(digest)

        def handle(resp: httpx.Response) -> None:
            if resp.status_code not in (200, 202, 204):
                self._wire.fail(resp, what, repo, digest)

        self._wire.request("DELETE", path, scope=repo, handle=handle)

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

    def _upload(self, repo: str, digest: str, body: BlobBody) -> bool:
        with self._holders_lock:
            holder = self._holders.get(digest)
        params = {"mount": digest, "from": holder} if holder and holder != repo else None

        def started(resp: httpx.Response) -> str | None:
            if resp.status_code == 201:
                return None  # mounted from `holder`: no bytes needed
            if resp.status_code != 202 or "location" not in resp.headers:
                self._wire.fail(resp, "upload", repo, digest)
            return resp.headers["location"]

        location = self._wire.request("POST", f"/v2/{repo}/blobs/uploads/", scope=repo, params=params, handle=started)
        if location is None:
            self.stats.add(mounts=1)
            return False
        if body.size > self.chunk_size:
            location = self._patch_chunks(repo, digest, body, location)
            put_headers, put_body = {"Content-Length": "0"}, b""
        else:
            put_headers = {"Content-Type": "application/octet-stream", "Content-Length": str(body.size)}
            put_body = lambda: body.iter(0, body.size)  # noqa: E731 - a fresh body per attempt

        def finished(resp: httpx.Response) -> None:
            if resp.status_code not in (201, 204):
                self._wire.fail(resp, "blob", repo, digest)

        self._wire.request("PUT", self._wire.session_url(location, digest=digest), scope=repo, retry=False,
                           headers=put_headers, body=put_body, handle=finished)
        self.stats.add(uploads=1, bytes_uploaded=body.size)
        return True

    def _patch_chunks(self, repo: str, digest: str, body: BlobBody, location: str) -> str:
        """PATCHes the blob in `chunk_size` pieces; resumes from the registry's offset after a
        transient failure (GET on the session says how much it has). Returns the last Location."""
        start, t0, attempt = 0, time.monotonic(), 0
        while start < body.size:
            n = min(self.chunk_size, body.size - start)
            try:
                location = self._wire.request(
                    "PATCH", self._wire.session_url(location), scope=repo, retry=False,
                    headers={"Content-Type": "application/octet-stream", "Content-Length": str(n),
                             "Content-Range": f"{start}-{start + n - 1}"},
                    body=lambda s=start, n=n: body.iter(s, n),
                    handle=lambda r: r.headers["location"] if r.status_code == 202 and "location" in r.headers
                    else self._wire.fail(r, "upload", repo, digest),
                )
                start += n
            except RegistryUnavailable:
                attempt += 1
                wait = self.retry.next_delay(attempt, time.monotonic() - t0)
                if wait is None:
                    raise
                self.stats.add(retries=1)
                self._wire.sleep(wait)
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

        return self._wire.request("GET", self._wire.session_url(location), scope=repo, handle=handle)

    # -- internals: requests -----------------------------------------------------------------

    def _head_blob(self, repo: str, digest: str) -> int | None:
        names.check_repo(repo)
        names.check_digest(digest)

        def handle(resp: httpx.Response) -> int | None:
            if resp.status_code == 200:
                return int(resp.headers.get("content-length", "0"))
            if resp.status_code == 404:
                return None
            self._wire.fail(resp, "blob", repo, digest)

        size = self._wire.request("HEAD", f"/v2/{repo}/blobs/{digest}", scope=repo, handle=handle)
        if size is not None:
            self._remember(digest, repo)
        return size

    def _paginate(self, path: str, *, scope: str, key: str, what: str) -> list[str]:
        out: list[str] = []
        url: str | httpx.URL = path
        params: dict[str, Any] | None = {"n": 1000}

        def handle(resp: httpx.Response) -> tuple[list[str], str | None]:
            if resp.status_code != 200:
                self._wire.fail(resp, what, scope, path)
            try:
                items = resp.json().get(key) or []
            except ValueError:
                raise RegistryError(f"registry sent invalid JSON for {path}", status=200) from None
            return [str(i) for i in items], resp.links.get("next", {}).get("url")

        for _ in range(100_000):  # a registry looping its Link header must not loop us forever
            items, nxt = self._wire.request("GET", url, scope=scope, params=params, handle=handle)
            out.extend(items)
            if not nxt:
                break
            url, params = httpx.URL(self.url + "/").join(nxt), None
        return out

    def _remember(self, digest: str, repo: str) -> None:
        with self._holders_lock:
            if len(self._holders) > 500_000:
                self._holders.clear()  # only hints for mounts: forgetting costs an upload at most
            self._holders[digest] = repo
