"""RegistryStore against fake registries (httpx.MockTransport): auth, retries, ranges, uploads.

Sleeps are injected (recorded, not slept), so retry budgets are asserted without wall clock.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re

import httpx
import pytest

from rollstack.errors import (
    BlobNotFound,
    IntegrityError,
    ManifestNotFound,
    RegistryAuthError,
    RegistryError,
    RegistryUnavailable,
)
from rollstack.store.registry import RegistryStore
from rollstack.store.retry import RetryPolicy

URL = "http://registry.test"
DATA = bytes(range(256)) * 40
DIGEST = "sha256:" + hashlib.sha256(DATA).hexdigest()


def make_store(handler, **kw) -> tuple[RegistryStore, list[float]]:
    slept: list[float] = []
    kw.setdefault("retry", RetryPolicy(retries=3, backoff=0.1, backoff_max=1.0, deadline=30.0))
    store = RegistryStore(URL, transport=httpx.MockTransport(handler), sleep=slept.append, **kw)
    return store, slept


def blob_handler(request: httpx.Request) -> httpx.Response:
    """A tiny honest registry holding DATA in repo `r` (HEAD/GET with ranges)."""
    if request.url.path != f"/v2/r/blobs/{DIGEST}":
        return httpx.Response(404, json={"errors": [{"code": "BLOB_UNKNOWN", "message": "blob unknown"}]})
    if request.method == "HEAD":
        return httpx.Response(200, headers={"Content-Length": str(len(DATA))})
    m = re.fullmatch(r"bytes=(\d+)-(\d+)", request.headers.get("range", ""))
    a, b = int(m.group(1)), int(m.group(2))
    if a >= len(DATA):
        return httpx.Response(416)
    b = min(b, len(DATA) - 1)
    return httpx.Response(206, content=DATA[a:b + 1], headers={"Content-Range": f"bytes {a}-{b}/{len(DATA)}"})


# -- ranges --------------------------------------------------------------------------------


def test_range_read_sends_range_and_returns_206_body():
    seen = []

    def handler(request):
        seen.append(request.headers.get("range"))
        return blob_handler(request)

    store, _ = make_store(handler)
    assert store.read_blob("r", DIGEST, 100, 50) == DATA[100:150]
    assert seen == ["bytes=100-149"]
    assert store.read_blob("r", DIGEST, len(DATA) - 5, 50) == DATA[-5:]
    assert store.read_blob("r", DIGEST, len(DATA), 50) == b""  # 416


def test_full_body_200_is_sliced():
    def handler(request):
        return httpx.Response(200, content=DATA)  # a server that ignores Range

    store, _ = make_store(handler)
    assert store.read_blob("r", DIGEST, 1000, 300) == DATA[1000:1300]
    assert store.read_blob("r", DIGEST, len(DATA) - 3, 300) == DATA[-3:]
    assert store.stats.bytes_read == 303


def test_206_with_wrong_start_is_an_error():
    def handler(request):
        return httpx.Response(206, content=b"xx", headers={"Content-Range": f"bytes 0-1/{len(DATA)}"})

    store, _ = make_store(handler)
    with pytest.raises(RegistryError):
        store.read_blob("r", DIGEST, 10, 2)


def test_404_blob_and_manifest_are_typed():
    def handler(request):
        return httpx.Response(404, json={"errors": [{"code": "UNKNOWN", "message": "x"}]})

    store, _ = make_store(handler)
    with pytest.raises(BlobNotFound):
        store.read_blob("r", DIGEST, 0, 1)
    with pytest.raises(BlobNotFound):
        store.blob_size("r", DIGEST)
    assert store.has_blob("r", DIGEST) is False
    with pytest.raises(ManifestNotFound):
        store.get_manifest("r", "latest")
    assert store.list_tags("r") == []


def test_other_status_is_registry_error_with_status():
    store, slept = make_store(lambda r: httpx.Response(418, text="teapot"))
    with pytest.raises(RegistryError) as exc:
        store.blob_size("r", DIGEST)
    assert exc.value.details["status"] == 418
    assert not isinstance(exc.value, RegistryUnavailable)
    assert slept == []  # not retried


def test_digest_invalid_is_integrity_error():
    def handler(request):
        if request.method == "HEAD":
            return httpx.Response(404)
        if request.method == "POST":
            return httpx.Response(202, headers={"Location": "/v2/r/blobs/uploads/u1"})
        return httpx.Response(400, json={"errors": [{"code": "DIGEST_INVALID", "message": "bad"}]})

    store, _ = make_store(handler)
    with pytest.raises(IntegrityError):
        store.put_blob("r", DIGEST, DATA)


# -- retries -------------------------------------------------------------------------------


def test_503_then_success_is_retried_with_backoff():
    calls = []

    def handler(request):
        calls.append(request.method)
        if len(calls) <= 2:
            return httpx.Response(503)
        return blob_handler(request)

    store, slept = make_store(handler)
    assert store.blob_size("r", DIGEST) == len(DATA)
    assert len(calls) == 3
    assert len(slept) == 2 and slept[1] > slept[0] > 0  # exponential
    assert store.stats.retries == 2


def test_429_honours_retry_after_capped():
    calls = []

    def handler(request):
        calls.append(1)
        if len(calls) == 1:
            return httpx.Response(429, headers={"Retry-After": "0.7"})
        if len(calls) == 2:
            return httpx.Response(429, headers={"Retry-After": "3600"})
        return blob_handler(request)

    store, slept = make_store(handler)
    assert store.has_blob("r", DIGEST)
    assert slept == [0.7, 1.0]  # server's hint, capped at backoff_max


@pytest.mark.parametrize("status", [500, 502, 503, 504, 429])
def test_persistent_5xx_ends_in_unavailable_after_bounded_attempts(status):
    calls = []

    def handler(request):
        calls.append(1)
        return httpx.Response(status)

    store, slept = make_store(handler)
    with pytest.raises(RegistryUnavailable) as exc:
        store.blob_size("r", DIGEST)
    assert len(calls) == 4  # 1 + retries
    assert len(slept) == 3
    assert exc.value.details["status"] == status


def test_connection_errors_end_in_unavailable():
    calls = []

    def handler(request):
        calls.append(1)
        raise httpx.ConnectError("connection refused", request=request)

    store, slept = make_store(handler)
    with pytest.raises(RegistryUnavailable):
        store.read_blob("r", DIGEST, 0, 10)
    assert len(calls) == 4 and len(slept) == 3


def test_timeouts_end_in_unavailable():
    def handler(request):
        raise httpx.ReadTimeout("slow", request=request)

    store, slept = make_store(handler)
    with pytest.raises(RegistryUnavailable):
        store.has_blob("r", DIGEST)


def test_deadline_stops_retries_with_real_clock(monkeypatch):
    import rollstack.store.registry as mod

    now = [0.0]
    monkeypatch.setattr(mod.time, "monotonic", lambda: now[0])

    def fake_sleep(s):
        now[0] += s

    calls = []

    def handler(request):
        calls.append(1)
        raise httpx.ConnectError("refused", request=request)

    policy = RetryPolicy(retries=100, backoff=1.0, backoff_max=4.0, deadline=10.0, jitter=0.0)
    store = RegistryStore(URL, transport=httpx.MockTransport(handler), sleep=fake_sleep, retry=policy)
    with pytest.raises(RegistryUnavailable):
        store.has_blob("r", DIGEST)
    assert now[0] <= 10.0  # never waited past the deadline
    assert len(calls) == 4  # delays 1 + 2 + 4 = 7, the next 4 would pass 10


def test_no_retry_when_disabled():
    calls = []

    def handler(request):
        calls.append(1)
        return httpx.Response(503)

    store, slept = make_store(handler, retry=RetryPolicy(retries=0))
    with pytest.raises(RegistryUnavailable):
        store.has_blob("r", DIGEST)
    assert len(calls) == 1 and slept == []


# -- auth ----------------------------------------------------------------------------------


class TokenRegistry:
    """Fake registry + token server: tokens `t1`, `t2`, ...; `revoke()` makes the current one stale."""

    def __init__(self, user: str | None = None, password: str | None = None) -> None:
        self.issued = 0
        self.valid: set[str] = set()
        self.token_requests: list[httpx.Request] = []
        self.user, self.password = user, password

    def revoke(self) -> None:
        self.valid.clear()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.host == "auth.test":
            self.token_requests.append(request)
            if self.user is not None:
                want = "Basic " + base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
                if request.headers.get("authorization") != want:
                    return httpx.Response(401)
            self.issued += 1
            tok = f"t{self.issued}"
            self.valid.add(tok)
            return httpx.Response(200, json={"token": tok, "expires_in": 300})
        auth = request.headers.get("authorization", "")
        if not auth.startswith("Bearer ") or auth[7:] not in self.valid:
            repo = request.url.path.split("/")[2]
            return httpx.Response(401, headers={"WWW-Authenticate":
                f'Bearer realm="https://auth.test/token",service="registry.test",scope="repository:{repo}:pull,push"'},
                json={"errors": [{"code": "UNAUTHORIZED", "message": "auth required"}]})
        return blob_handler(request)


def test_bearer_token_flow_and_cache():
    reg = TokenRegistry(user="alice", password="s3cret")
    store, _ = make_store(reg, username="alice", password="s3cret")
    assert store.blob_size("r", DIGEST) == len(DATA)
    assert reg.issued == 1
    q = reg.token_requests[0].url.params
    assert q["service"] == "registry.test" and q["scope"] == "repository:r:pull,push"
    assert store.read_blob("r", DIGEST, 0, 4) == DATA[:4]
    assert reg.issued == 1  # cached


def test_bearer_token_refreshed_on_401():
    reg = TokenRegistry()
    store, _ = make_store(reg)
    assert store.has_blob("r", DIGEST)
    reg.revoke()  # token expired server-side
    assert store.read_blob("r", DIGEST, 10, 5) == DATA[10:15]
    assert reg.issued == 2


def test_401_after_refresh_is_auth_error():
    def handler(request):
        if request.url.host == "auth.test":
            return httpx.Response(200, json={"token": "useless"})
        return httpx.Response(401, headers={"WWW-Authenticate": 'Bearer realm="https://auth.test/token",service="s"'})

    store, _ = make_store(handler)
    with pytest.raises(RegistryAuthError):
        store.has_blob("r", DIGEST)


def test_token_server_refusal_is_auth_error():
    reg = TokenRegistry(user="alice", password="right")
    store, _ = make_store(reg, username="alice", password="wrong")
    with pytest.raises(RegistryAuthError):
        store.has_blob("r", DIGEST)


def test_403_is_auth_error():
    store, _ = make_store(lambda r: httpx.Response(403, json={"errors": [{"code": "DENIED", "message": "no"}]}))
    with pytest.raises(RegistryAuthError):
        store.has_blob("r", DIGEST)


def test_basic_auth_challenge():
    want = "Basic " + base64.b64encode(b"bob:pw").decode()

    def handler(request):
        if request.headers.get("authorization") != want:
            return httpx.Response(401, headers={"WWW-Authenticate": 'Basic realm="registry"'})
        return blob_handler(request)

    store, _ = make_store(handler, username="bob", password="pw")
    assert store.has_blob("r", DIGEST)
    anon, _ = make_store(handler)
    with pytest.raises(RegistryAuthError):
        anon.has_blob("r", DIGEST)


# -- uploads -------------------------------------------------------------------------------


class UploadRegistry:
    """Fake registry recording an upload session (monolithic or chunked)."""

    def __init__(self, fail_patch_once: bool = False, lose_session: bool = False, fail_patch_number: int = 1) -> None:
        self.lose_session = lose_session
        self.fail_patch_number, self.patches = fail_patch_number, 0
        self.stored: dict[str, bytes] = {}
        self.sessions: dict[str, bytearray] = {}
        self.log: list[tuple[str, str, str | None]] = []
        self.fail_patch_once = fail_patch_once

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path, method = request.url.path, request.method
        self.log.append((method, path, request.headers.get("content-range")))
        if method == "HEAD":
            digest = path.rsplit("/", 1)[1]
            return httpx.Response(200, headers={"Content-Length": "1"}) if digest in self.stored else httpx.Response(404)
        if method == "POST":
            sid = f"s{len(self.sessions)}"
            self.sessions[sid] = bytearray()
            return httpx.Response(202, headers={"Location": f"/v2/r/blobs/uploads/{sid}?_state=abc"})
        sid = path.rsplit("/", 1)[1]
        assert request.url.params["_state"] == "abc"  # the Location's query is kept
        body = request.read()
        if method == "GET":
            if self.lose_session:
                return httpx.Response(404, json={"errors": [{"code": "BLOB_UPLOAD_UNKNOWN", "message": "x"}]})
            held = len(self.sessions[sid])
            return httpx.Response(204, headers={"Range": f"0-{max(held - 1, 0)}",
                                                "Location": f"/v2/r/blobs/uploads/{sid}?_state=abc"})
        if method == "PATCH":
            self.patches += 1
            if self.fail_patch_once and self.patches == self.fail_patch_number:
                self.fail_patch_once = False
                return httpx.Response(503)
            start, end = map(int, request.headers["content-range"].split("-"))
            assert start == len(self.sessions[sid]) and end - start + 1 == len(body)
            self.sessions[sid] += body
            return httpx.Response(202, headers={"Location": f"/v2/r/blobs/uploads/{sid}?_state=abc"})
        if method == "PUT":
            self.sessions[sid] += body
            digest = request.url.params["digest"]
            if "sha256:" + hashlib.sha256(self.sessions[sid]).hexdigest() != digest:
                return httpx.Response(400, json={"errors": [{"code": "DIGEST_INVALID", "message": "x"}]})
            self.stored[digest] = bytes(self.sessions[sid])
            return httpx.Response(201, headers={"Docker-Content-Digest": digest})
        return httpx.Response(405)


def test_monolithic_upload_streams_file(tmp_path):
    reg = UploadRegistry()
    store, _ = make_store(reg)
    path = tmp_path / "blob"
    path.write_bytes(DATA)
    assert store.put_blob("r", DIGEST, path) is True
    assert reg.stored[DIGEST] == DATA
    assert [m for m, _, _ in reg.log] == ["HEAD", "POST", "PUT"]
    assert store.put_blob("r", DIGEST, path) is False  # HEAD says it is there
    assert [m for m, _, _ in reg.log][3:] == ["HEAD"]


def test_chunked_upload_uses_patch_ranges(tmp_path):
    reg = UploadRegistry()
    store, _ = make_store(reg, chunk_size=4000)
    path = tmp_path / "blob"
    path.write_bytes(DATA)  # 10240 bytes -> 3 PATCHes
    assert store.put_blob("r", DIGEST, path) is True
    assert reg.stored[DIGEST] == DATA
    patches = [cr for m, _, cr in reg.log if m == "PATCH"]
    assert patches == ["0-3999", "4000-7999", "8000-10239"]
    assert [m for m, _, _ in reg.log][-1] == "PUT"
    assert store.stats.bytes_uploaded == len(DATA) and store.stats.uploads == 1


@pytest.mark.parametrize("failing_patch", [1, 2, 3])
def test_chunked_upload_resumes_after_transient_failure(failing_patch):
    reg = UploadRegistry(fail_patch_once=True, fail_patch_number=failing_patch)
    store, slept = make_store(reg, chunk_size=4000)
    assert store.put_blob("r", DIGEST, DATA) is True
    assert reg.stored[DIGEST] == DATA
    methods = [m for m, _, _ in reg.log]
    assert methods.count("POST") == 1 and "GET" in methods  # asked the session, resumed it
    patches = [cr for m, _, cr in reg.log if m == "PATCH"]
    assert patches.count(["0-3999", "4000-7999", "8000-10239"][failing_patch - 1]) == 2  # only that chunk again
    assert len(slept) == 1


def test_chunked_upload_starts_over_when_session_lost():
    reg = UploadRegistry(fail_patch_once=True, lose_session=True)
    store, slept = make_store(reg, chunk_size=4000)
    assert store.put_blob("r", DIGEST, DATA) is True
    assert reg.stored[DIGEST] == DATA
    assert [m for m, _, _ in reg.log].count("POST") == 2  # a fresh session


def test_cross_repo_mount_when_holder_known():
    posts = []

    def handler(request):
        if request.method == "HEAD":
            repo = request.url.path.split("/")[2]
            return httpx.Response(200, headers={"Content-Length": "3"}) if repo == "src" else httpx.Response(404)
        if request.method == "POST":
            posts.append(dict(request.url.params))
            return httpx.Response(201, headers={"Location": f"/v2/dst/blobs/{DIGEST}"})
        raise AssertionError(f"unexpected {request.method}")

    store, _ = make_store(handler)
    assert store.has_blob("src", DIGEST)
    assert store.put_blob("dst", DIGEST, DATA) is False
    assert posts == [{"mount": DIGEST, "from": "src"}]
    assert store.stats.mounts == 1


def test_failed_mount_falls_back_to_upload():
    reg = UploadRegistry()
    store, _ = make_store(reg)
    store._remember(DIGEST, "elsewhere")  # believed held elsewhere, but the mount is refused
    assert store.put_blob("r", DIGEST, DATA) is True
    post = next(req for req in reg.log if req[0] == "POST")
    assert post[1] == "/v2/r/blobs/uploads/"
    assert reg.stored[DIGEST] == DATA and store.stats.mounts == 0


def test_bytes_with_wrong_digest_never_sent():
    store, _ = make_store(lambda r: pytest.fail("no request expected"))
    with pytest.raises(IntegrityError):
        store.put_blob("r", DIGEST, b"other")


# -- manifests and listings ----------------------------------------------------------------


def test_manifest_get_sends_accept_and_verifies_digest():
    body = json.dumps({"schemaVersion": 2, "manifests": []}).encode()
    digest = "sha256:" + hashlib.sha256(body).hexdigest()

    def handler(request):
        assert "application/vnd.oci.image.index.v1+json" in request.headers["accept"]
        return httpx.Response(200, content=body if request.url.path.endswith(digest) else body + b" ",
                              headers={"Content-Type": "application/vnd.oci.image.index.v1+json; charset=utf-8"})

    store, _ = make_store(handler)
    m = store.get_manifest("r", digest)
    assert (m.digest, m.media_type) == (digest, "application/vnd.oci.image.index.v1+json")
    other = "sha256:" + "0" * 64
    with pytest.raises(IntegrityError):
        store.get_manifest("r", other)


def test_tag_and_catalog_pagination():
    def handler(request):
        if request.url.path == "/v2/_catalog":
            if request.url.params.get("last") == "b":
                return httpx.Response(200, json={"repositories": ["c"]})
            return httpx.Response(200, json={"repositories": ["b", "a"]},
                                  headers={"Link": '</v2/_catalog?last=b&n=2>; rel="next"'})
        return httpx.Response(200, json={"name": "r", "tags": None})

    store, _ = make_store(handler)
    assert store.list_repositories() == ["a", "b", "c"]
    assert store.list_tags("r") == []


def test_event_hooks_see_every_request():
    seen = []
    store, _ = make_store(blob_handler, event_hooks={"request": [lambda r: seen.append(r.method)]})
    store.has_blob("r", DIGEST)
    store.read_blob("r", DIGEST, 0, 1)
    assert seen == ["HEAD", "GET"]


class _BrokenStream(httpx.SyncByteStream):
    def __iter__(self):
        yield b"par"
        raise httpx.ReadError("connection reset mid-body")


def test_body_cut_short_is_retried():
    calls = []

    def handler(request):
        calls.append(1)
        if len(calls) == 1:
            return httpx.Response(206, stream=_BrokenStream(),
                                  headers={"Content-Range": f"bytes 0-9/{len(DATA)}"})
        return blob_handler(request)

    store, slept = make_store(handler)
    assert store.read_blob("r", DIGEST, 0, 10) == DATA[:10]
    assert len(calls) == 2 and len(slept) == 1


# -- several ranges in one GET -------------------------------------------------------------------


def multi_range_handler(mode: str, seen: list[str]):
    def handler(request: httpx.Request) -> httpx.Response:
        rng = request.headers.get("range", "")
        seen.append(rng)
        spans = [tuple(map(int, p.split("-"))) for p in rng.removeprefix("bytes=").split(",")]
        if len(spans) == 1 or mode == "honest-single":
            return blob_handler(request)
        if mode == "ignore":  # Range ignored: the whole blob
            return httpx.Response(200, content=DATA)
        if mode == "merge":  # one covering range (RFC 9110 allows it)
            a, b = spans[0][0], spans[-1][1]
            return httpx.Response(206, content=DATA[a:b + 1], headers={"Content-Range": f"bytes {a}-{b}/{len(DATA)}"})
        body = b""
        for a, b in spans:
            body += f"\r\n--XyZ\r\nContent-Range: bytes {a}-{b}/{len(DATA)}\r\n\r\n".encode() + DATA[a:b + 1]
        if mode == "garbled":
            body = body[:-7]
        return httpx.Response(206, content=body + b"\r\n--XyZ--\r\n",
                              headers={"Content-Type": "multipart/byteranges; boundary=XyZ"})
    return handler


@pytest.mark.parametrize("mode,requests,still_multi", [("honest", 1, True), ("merge", 1, True),
                                                       ("ignore", 4, False), ("garbled", 4, False)])
def test_read_ranges_in_one_get_or_one_get_per_span(mode, requests, still_multi):
    seen: list[str] = []
    store, _ = make_store(multi_range_handler(mode, seen))
    spans = [(0, 10), (500, 20), (9000, 100)]
    assert store.read_ranges("r", DIGEST, spans) == [DATA[o:o + n] for o, n in spans]
    assert len(seen) == requests and seen[0] == "bytes=0-9,500-519,9000-9099"
    assert store.multi_range is still_multi
    seen.clear()
    assert store.read_ranges("r", DIGEST, spans) == [DATA[o:o + n] for o, n in spans]
    assert len(seen) == (1 if still_multi else 3)  # once shown otherwise, one GET per span from then on


def test_read_ranges_splits_more_spans_than_one_header_takes():
    from rollstack.store.byteranges import MAX_SPANS

    seen: list[str] = []
    store, _ = make_store(multi_range_handler("honest", seen))
    spans = [(i * 100, 10) for i in range(MAX_SPANS + 5)]
    assert store.read_ranges("r", DIGEST, spans) == [DATA[o:o + n] for o, n in spans]
    assert len(seen) == 2


def test_read_ranges_refuses_an_endless_answer():
    def handler(request):
        return httpx.Response(206, content=b"--XyZ\r\n" + b"x" * 100_000,
                              headers={"Content-Type": "multipart/byteranges; boundary=XyZ"})

    store, _ = make_store(handler)
    with pytest.raises(RegistryError, match="more than"):
        store.read_ranges("r", DIGEST, [(0, 10), (100, 10)])
