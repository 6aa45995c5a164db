"""The per-environment nftables table (pure text) and policy resolution."""

from __future__ import annotations

import pytest

from rollstack.errors import PlanInvalid
from rollstack.plan.network import parse_allow
from rollstack.run.network import (
    DEFAULT_POOL, GATEWAY_REF, NetHandle, NetworkManager, NetworkSpec, Rule, resolve_spec, ruleset,
)

H = NetHandle(slot=7, netns="rsn-7", host_if="rsnh7", gateway="10.213.0.29", address="10.213.0.30",
              state_dir="/nonexistent")


def _chain(text: str, name: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(f"  chain {name} {{")
    end = lines.index("  }", start)
    return [line.strip() for line in lines[start + 1:end]]


def test_allow_rules_order_and_scope():
    spec = NetworkSpec("allow", (Rule(8000), Rule(443, "10.9.0.0/16")))
    text = ruleset(H, spec, DEFAULT_POOL)
    assert text.startswith("table inet rsn_7 {")
    src = _chain(text, "from_env")
    assert src[0] == "ip saddr != 10.213.0.30 drop"  # anti-spoofing first
    node = _chain(text, "to_node")
    # the node entry (gateway:8000) is accepted before the deny list (which holds the pool)
    assert node[0] == "ip daddr 10.213.0.29 meta l4proto { tcp, udp } th dport 8000 accept"
    assert node[1].startswith("ip daddr { 169.254.0.0/16") and DEFAULT_POOL in node[1]
    assert node[-1] == "drop"
    beyond = _chain(text, "beyond")
    assert beyond[0].endswith("drop") and "169.254.0.0/16" in beyond[0]
    assert beyond[1] == "ip daddr 10.9.0.0/16 meta l4proto { tcp, udp } th dport 443 accept"
    assert beyond[-1] == "drop" and "accept" not in " ".join(beyond[:1])
    assert not any("10.213.0.29" in r for r in beyond)  # the gateway is never forwarded to
    assert 'ip saddr 10.213.0.30 oifname != "rsnh7" masquerade' in text
    fwd = _chain(text, "forward")
    assert fwd[-2:] == ['oifname "rsnh7" ct state established,related accept', 'oifname "rsnh7" drop']


def test_an_entry_without_a_port_accepts_every_port_of_its_network():
    spec = resolve_spec("allow", [parse_allow("10.9.0.0/16"), parse_allow("10.1.2.3:443")], [])
    assert spec.rules == (Rule(None, "10.9.0.0/16"), Rule(443, "10.1.2.3/32"))
    assert spec.endpoints == ("10.9.0.0/16", "10.1.2.3:443")
    beyond = _chain(ruleset(H, spec, DEFAULT_POOL), "beyond")
    assert beyond[1:] == ["ip daddr 10.9.0.0/16 accept",
                          "ip daddr 10.1.2.3/32 meta l4proto { tcp, udp } th dport 443 accept", "drop"]
    assert "169.254.0.0/16" in beyond[0]  # the deny list still comes first
    # to the node's own addresses, only what names a port (a whole network must not open the
    # node's services when the node's address is in it)
    assert _chain(ruleset(H, spec, DEFAULT_POOL), "to_node")[1:] == [
        "ip daddr 10.1.2.3/32 meta l4proto { tcp, udp } th dport 443 accept", "drop"]


def test_outbound_accepts_past_the_deny_list_but_not_to_the_node():
    text = ruleset(H, NetworkSpec("outbound"), DEFAULT_POOL)
    assert _chain(text, "beyond")[1:] == ["accept", "drop"]
    assert _chain(text, "to_node")[1:] == ["drop"]
    assert "masquerade" in text


def test_none_with_expose_has_no_egress_and_no_nat():
    text = ruleset(H, NetworkSpec("none", expose=(8080,)), DEFAULT_POOL)
    assert _chain(text, "beyond")[1:] == ["drop"] and _chain(text, "to_node")[1:] == ["drop"]
    assert "masquerade" not in text
    assert NetworkSpec("none", expose=(8080,)).needs_netns and not NetworkSpec("none").needs_netns


def test_resolve_spec_endpoints_and_errors():
    entries = [parse_allow(e) for e in ("host:8000", "10.1.2.3:443", "10.8.0.0/16:80", "localhost.:1")[:3]]
    spec = resolve_spec("allow", entries, [8080])
    assert spec.endpoints == (f"{GATEWAY_REF}:8000", "10.1.2.3:443", "10.8.0.0/16:80")
    assert spec.rules == (Rule(8000), Rule(443, "10.1.2.3/32"), Rule(80, "10.8.0.0/16"))
    with pytest.raises(PlanInvalid, match=r"^network.allow\[0\]: .*node agent"):
        resolve_spec("allow", [parse_allow("host:7878")], [], reserved_node_ports=(7878,))
    with pytest.raises(PlanInvalid, match=r"^network.allow\[1\]: cannot resolve 'no-such.invalid'"):
        resolve_spec("allow", [parse_allow("host:1"), parse_allow("no-such.invalid:1")], [])


def test_allowed_names_become_hosts_entries(monkeypatch, tmp_path):
    import socket

    from rollstack.run.files import SafeRoot
    from rollstack.run.network import HOSTS_MARK, add_hosts

    answers = {"model.internal": ["10.9.0.7", "10.9.0.8"], "pypi.internal": ["10.9.1.1"]}
    monkeypatch.setattr(socket, "getaddrinfo", lambda name, port, *a: [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", (addr, port)) for addr in answers[name]])
    spec = resolve_spec("allow", [parse_allow(e) for e in
                                  ("model.internal:30000", "pypi.internal:443", "model.internal:8000")], [])
    assert spec.hosts == (("10.9.0.7", "model.internal"), ("10.9.0.8", "model.internal"),
                          ("10.9.1.1", "pypi.internal"))
    assert spec.endpoints == ("10.9.0.7:30000", "10.9.1.1:443", "10.9.0.7:8000")
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "etc/hosts").write_text("127.0.0.1 localhost")  # no final newline
    add_hosts(SafeRoot(root), spec)
    assert (root / "etc/hosts").read_text() == (
        f"127.0.0.1 localhost\n{HOSTS_MARK}\n10.9.0.7\tmodel.internal\n10.9.0.8\tmodel.internal\n"
        "10.9.1.1\tpypi.internal\n")
    (root / "etc/hosts").write_text((root / "etc/hosts").read_text() + "# the user's own line\n10.0.0.1\tmine\n")
    answers["model.internal"] = ["10.9.0.9"]  # re-resolved by a policy update: replaces, not appends
    again = resolve_spec("allow", [parse_allow("model.internal:30000")], [])
    add_hosts(SafeRoot(root), again, replace=True)
    assert (root / "etc/hosts").read_text() == (
        f"127.0.0.1 localhost\n# the user's own line\n10.0.0.1\tmine\n{HOSTS_MARK}\n10.9.0.9\tmodel.internal\n")
    add_hosts(SafeRoot(root), resolve_spec("outbound", [], []), replace=True)  # no names: the block goes
    assert HOSTS_MARK not in (root / "etc/hosts").read_text()
    empty = tmp_path / "empty"
    empty.mkdir()
    add_hosts(SafeRoot(empty), spec)  # no /etc/hosts in the image: one is made
    assert (empty / "etc/hosts").read_text().startswith("127.0.0.1\tlocalhost\n" + HOSTS_MARK)
    add_hosts(SafeRoot(empty / "none"), resolve_spec("allow", [parse_allow("10.1.2.3:1")], []))  # nothing to add
    assert not (empty / "none").exists()


def test_pool_slots_and_addresses(tmp_path):
    mgr = NetworkManager(pool="10.77.0.0/28", state_dir=tmp_path)
    assert mgr.slots == 4
    got = [mgr.claim(f"o{i}") for i in range(4)]
    assert sorted(h.slot for h in got) == [0, 1, 2, 3]
    for h in got:
        assert h.gateway == f"10.77.0.{4 * h.slot + 1}" and h.address == f"10.77.0.{4 * h.slot + 2}"
        assert len(h.host_if) <= 15
    with pytest.raises(Exception, match="exhausted"):
        mgr.claim("one-too-many")
    assert mgr.owned("o") == [0, 1, 2, 3]
