"""RegistryServer's generated config and address handling (no process started)."""

from __future__ import annotations

import pytest

from rollstack.errors import InvalidRequest
from rollstack.store.server import RegistryServer, parse_addr


def test_generated_config(tmp_path):
    cfg = RegistryServer(tmp_path, "127.0.0.1:5123").config()
    assert cfg["storage"]["filesystem"]["rootdirectory"] == str(tmp_path / "data")
    assert cfg["storage"]["delete"] == {"enabled": True}
    assert cfg["http"]["addr"] == "127.0.0.1:5123"
    assert "auth" not in cfg


def test_htpasswd_config_writes_bcrypt_hashes(tmp_path):
    server = RegistryServer(tmp_path, htpasswd={"alice": "pw"}, htpasswd_cost=4)
    cfg = server.config()
    assert cfg["auth"]["htpasswd"]["path"] == str(tmp_path / "htpasswd")
    user, hashed = (tmp_path / "htpasswd").read_text().strip().split(":", 1)
    assert user == "alice" and hashed.startswith("$2b$04$")


def test_raw_auth_section(tmp_path):
    auth = {"token": {"realm": "http://127.0.0.1:1/token", "service": "s", "issuer": "i", "rootcertbundle": "/x"}}
    assert RegistryServer(tmp_path, auth=auth).config()["auth"] == auth


@pytest.mark.parametrize("addr,want", [("127.0.0.1:5000", ("127.0.0.1", 5000)), (":5000", ("127.0.0.1", 5000)),
                                       ("localhost:0", ("localhost", 0))])
def test_parse_addr(addr, want):
    assert parse_addr(addr) == want


@pytest.mark.parametrize("addr", ["5000", "host:", "host:port", "h:70000", ""])
def test_parse_addr_rejects(addr):
    with pytest.raises(InvalidRequest):
        parse_addr(addr)


def test_url_and_unstarted_stop(tmp_path):
    server = RegistryServer(tmp_path, "127.0.0.1:5999")
    assert server.url == "http://127.0.0.1:5999"
    server.stop()  # nothing started: a no-op
    server.kill()
