"""`network:` / `expose:` in plans: accepted shapes, and every bad entry named with its reason."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, strategies as st

from rollstack.errors import PlanInvalid
from rollstack.plan.model import load_plan
from rollstack.plan.network import AllowPolicy, network_mode, parse_allow


def _plan(**kw):
    return load_plan({"groups": ["a/b:1"], **kw})


def test_modes_and_defaults():
    assert _plan().network == "none" and _plan().expose == []
    assert network_mode(_plan(network="outbound").network) == "outbound"
    p = _plan(network={"allow": ["host:8000", "10.0.0.0/8:443", "models.lan:30000"]}, expose=[8080])
    assert isinstance(p.network, AllowPolicy) and network_mode(p.network) == "allow"
    e = p.network.entries()
    assert e[0].node and e[0].port == 8000
    assert e[1].net == ipaddress.IPv4Network("10.0.0.0/8") and e[1].port == 443
    assert e[2].name == "models.lan"
    assert p.expose == [8080]
    # round trip through the wire form (what the SDK sends, what recovery stores)
    again = load_plan(p.model_dump(mode="json", exclude_none=True))
    assert again.network == p.network and again.expose == [8080]


@pytest.mark.parametrize("network, words", [
    ("everything", "not a network mode"),
    ({"allow": []}, "at least one endpoint"),
    ({"allow": ["host"]}, "allow[0]: 'host': the node is reached on one port"),
    ({"allow": [":80"]}, "must be 'HOST:PORT'"),
    ({"allow": ["host:8000", "h:70000"]}, "allow[1]: 'h:70000': port 70000 is out of range"),
    ({"allow": ["h:0"]}, "out of range"),
    ({"allow": ["h:http"]}, "is not a port number"),
    ({"allow": ["[::1]:80"]}, "IPv6"),
    ({"allow": ["10.0.0.300:80"]}, "not an IPv4 address"),
    ({"allow": ["169.254.169.254:80"]}, "never reachable"),
    ({"allow": ["169.0.0.0/8:80"]}, "overlaps 169.254.0.0/16"),
    ({"allow": ["127.0.0.1:80"]}, "use 'host:PORT'"),
    ({"allow": ["localhost:80"]}, "use 'host:PORT'"),
    ({"allow": ["bad_name!:80"]}, "not a host name"),
    ({"allow": [80]}, "must be a string"),
    ({"allow": "h:80"}, "must be a list"),
    ({"deny": ["h:80"]}, "unknown field 'deny'"),
    (7, "not int"),
])
def test_bad_network_is_plan_invalid_naming_the_entry(network, words):
    with pytest.raises(PlanInvalid) as exc:
        _plan(network=network)
    assert exc.value.message.startswith("network: ") and words in exc.value.message, exc.value.message


@pytest.mark.parametrize("expose, words", [
    ([0], "expose[0] 0 is out of range"), ([8080, 65536], "expose[1] 65536"),
    ([80, 80], "must not repeat"), (["x"], "not a port"), (8080, "must be a list"),
])
def test_bad_expose(expose, words):
    with pytest.raises(PlanInvalid, match=r"^expose: ") as exc:
        _plan(expose=expose)
    assert words in exc.value.message


def test_any_address_allowed_with_the_deny_list_left_to_the_node():
    assert parse_allow("0.0.0.0/0:443").net.prefixlen == 0


def test_an_entry_without_a_port_allows_every_port():
    one, net, name = parse_allow("10.0.0.1"), parse_allow("10.8.0.0/16"), parse_allow("models.lan")
    assert (one.port, str(one.net)) == (None, "10.0.0.1/32")
    assert (net.port, str(net.net)) == (None, "10.8.0.0/16")
    assert (name.port, name.name) == (None, "models.lan")
    with pytest.raises(ValueError, match="never reachable"):
        parse_allow("169.254.169.254")


@given(st.ip_addresses(v=4), st.integers(1, 65535))
def test_address_entries_parse_exactly(addr, port):
    denied = any(addr in n for n in map(ipaddress.IPv4Network,
                 ("169.254.0.0/16", "127.0.0.0/8", "0.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4")))
    if denied:
        with pytest.raises(ValueError):
            parse_allow(f"{addr}:{port}")
    else:
        e = parse_allow(f"{addr}:{port}")
        assert e.net == ipaddress.IPv4Network(f"{addr}/32") and e.port == port


@given(st.integers().filter(lambda p: not 1 <= p <= 65535))
def test_ports_out_of_range_are_refused(port):
    with pytest.raises(ValueError, match="out of range|not a port"):
        parse_allow(f"10.1.2.3:{port}")
