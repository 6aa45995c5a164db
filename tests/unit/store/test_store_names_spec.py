"""Pure pieces of the store package: names, open_store specs, auth challenges, retry policy."""

from __future__ import annotations

import pytest

from rollstack.errors import InvalidRequest
from rollstack.store import OciLayoutStore, RegistryStore, open_store
from rollstack.store.auth import TokenCache, parse_challenge
from rollstack.store.names import check_digest, check_repo, check_tag, manifest_references, OCI_INDEX, OCI_MANIFEST
from rollstack.store.retry import RetryPolicy


@pytest.mark.parametrize("repo", ["a", "os/debian-python", "a.b_c/d__e/f-g", "x0/y1"])
def test_valid_repos(repo):
    assert check_repo(repo) == repo


@pytest.mark.parametrize("repo", ["", "A", "a/", "/a", "a//b", "../x", "a/../b", "-a", "a_", "a/.b", "a b", "a/_blobs"])
def test_invalid_repos(repo):
    with pytest.raises(InvalidRequest):
        check_repo(repo)


def test_tags_and_digests():
    assert check_tag("23.2.0") == "23.2.0"
    for bad in ["", ".x", "-x", "a" * 129, "a/b", "a:b"]:
        with pytest.raises(InvalidRequest):
            check_tag(bad)
    with pytest.raises(InvalidRequest):
        check_digest("sha512:" + "0" * 128)
    with pytest.raises(InvalidRequest):
        check_digest("sha256:" + "A" * 64)


def test_manifest_references():
    d1, d2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    doc = ('{"config": {"digest": "%s"}, "layers": [{"digest": "%s"}, {"digest": "sha256:%s", "urls": ["http://x"]}]}'
           % (d1, d2, "3" * 64)).encode()
    assert manifest_references(doc, OCI_MANIFEST) == ([d1, d2], [])
    assert manifest_references(('{"manifests": [{"digest": "%s"}]}' % d1).encode(), OCI_INDEX) == ([], [d1])
    for bad in [b"[]", b"{", b'{"layers": []}', b'{"config": {"digest": "x"}}',
                ('{"mediaType": "%s", "config": {"digest": "%s"}}' % (OCI_INDEX, d1)).encode()]:
        with pytest.raises(InvalidRequest):
            manifest_references(bad, OCI_MANIFEST)


def test_open_store_specs(tmp_path):
    s = open_store(f"oci:{tmp_path / 'a'}")
    assert isinstance(s, OciLayoutStore) and s.url == f"oci:{tmp_path / 'a'}"
    assert isinstance(open_store(str(tmp_path / "b")), OciLayoutStore)
    assert isinstance(open_store(None, env={"ROLLSTACK_STORE": f"oci:{tmp_path / 'c'}"}), OciLayoutStore)
    assert (tmp_path / "c" / "index.json").exists()
    r = open_store("http://user:p%40ss@127.0.0.1:5999/")
    assert isinstance(r, RegistryStore) and r.url == "http://127.0.0.1:5999"
    assert (r._wire.username, r._wire.password) == ("user", "p@ss")
    r.close()
    r = open_store("https://reg.example:443", env={"ROLLSTACK_REGISTRY_USERNAME": "u", "ROLLSTACK_REGISTRY_PASSWORD": "p"})
    assert r._wire.username == "u"
    r.close()
    for bad in ["", "s3://bucket", "oci:", "http://"]:
        with pytest.raises(InvalidRequest):
            open_store(bad)
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidRequest):
        open_store(str(tmp_path / "file"))


def test_default_store_is_home_layout(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    s = open_store(None, env={})
    assert s.url == f"oci:{tmp_path}/.local/share/rollstack/store"


def test_parse_challenge():
    c = parse_challenge('Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:a:pull repository:b:pull,push"')
    assert c.scheme == "bearer"
    assert c.params["realm"] == "https://auth.docker.io/token"
    assert c.scopes == ["repository:a:pull", "repository:b:pull,push"]
    assert parse_challenge('Basic realm="x"').scheme == "basic"
    assert parse_challenge("") is None and parse_challenge(None) is None
    assert parse_challenge('Bearer realm=http://a/t,service=s').params == {"realm": "http://a/t", "service": "s"}


def test_token_cache_expiry():
    now = [100.0]
    cache = TokenCache(clock=lambda: now[0])
    cache.put("r", "tok", 60)
    assert cache.get("r") == "tok"
    now[0] += 56  # refreshed 5 s early
    assert cache.get("r") is None
    cache.put("r", "tok2", None)
    cache.drop("r")
    assert cache.get("r") is None


def test_retry_policy():
    p = RetryPolicy(retries=3, backoff=0.5, backoff_max=3.0, deadline=10.0, jitter=0.0)
    assert [p.delay(i) for i in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 3.0]
    assert p.delay(1, "2") == 2.0 and p.delay(1, "99") == 3.0 and p.delay(1, "Wed, 21 Oct 2015 07:28:00 GMT") == 0.5
    assert p.next_delay(4, 0.0) is None  # count spent
    assert p.next_delay(1, 9.9) is None  # deadline spent
    assert p.next_delay(2, 1.0) == 1.0
