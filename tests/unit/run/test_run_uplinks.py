"""Which host interfaces egress switches forwarding on: parsed from `ip -j route` (pure), and
chosen per spec (configured ones win; otherwise the routes to the destinations)."""

from __future__ import annotations

import json

from rollstack.run import network
from rollstack.run.network import NetworkManager, NetworkSpec, Rule
from rollstack.run.nettools import devices_of


def test_devices_of_keeps_host_interfaces_only() -> None:
    text = json.dumps([{"dst": "default", "dev": "eth0"}, {"dev": "lo"}, {"dev": "rsn-h3"},
                       {"dev": "../../x"}, {"dev": "wlan0"}, {"gateway": "1.2.3.4"}, "junk"])
    assert devices_of(text) == {"eth0", "wlan0"}
    assert devices_of("not json") == set() and devices_of("") == set() and devices_of('{"a": 1}') == set()


def test_uplinks_configured_win_else_the_routes_to_the_destinations(monkeypatch, tmp_path) -> None:
    asked = []
    monkeypatch.setattr(network, "route_devices", lambda dests: asked.append(list(dests)) or {"eth1", "eth0"})
    auto = NetworkManager(state_dir=tmp_path)
    allow = NetworkSpec("allow", rules=(Rule(8080, "10.1.2.0/24"), Rule(22, None), Rule(443, "192.0.2.7/32")))
    assert auto.uplinks(allow) == ["eth0", "eth1"]
    assert asked == [["10.1.2.0", "192.0.2.7"]]  # the node itself (net None) needs no uplink
    assert auto.uplinks(NetworkSpec("outbound")) == ["eth0", "eth1"] and asked[-1] == ["default"]
    fixed = NetworkManager(state_dir=tmp_path, forward_interfaces=("eth9",))
    assert fixed.uplinks(allow) == ["eth9"] and len(asked) == 2
