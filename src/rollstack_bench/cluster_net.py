"""Per-node network namespaces for `bench cluster`: each node its own shaped link, like a host.

`Fabric(n, profile)` builds, on this machine:

    host netns ── veth (unshaped) ──┐
    (registry, driver, Ray)          │  fabric netns: bridge br0 (L2, no routing)
    node netns 0 ── veth (tbf) ──────┤
    ...                              │
    node netns n-1 ── veth (tbf) ────┘

All on one /24 of 10.214.0.0/16 that exists only on these veths. Each node veth is rate-limited
by `tc` tbf in both directions (the profile's rate; this kernel has no netem, and no delay is
added), so everything a node receives (registry blobs, peer chunks, API calls) crosses its own
link, and nodes reach each other (peers) and the registry only through their links. The
registry listens in the host namespace on `host_ip`.

A node agent joins its namespace by `nsenter --net=/run/netns/NAME` (the network namespace
only: mounts, cgroups and /proc stay the host's, so the agent's FUSE and overlay mounts and its
environments are visible and cleaned as before). The cluster code does this when the Ray node's
raylet carries `ROLLSTACK_NETNS` / `ROLLSTACK_NODE_IP` in its environment (its actors inherit
it); see rollstack.cluster.host.

Byte counters: `node_rx_bytes(i)` = bytes the fabric delivered to node i (its download side),
`host_tx_bytes()` = bytes the host sent into the fabric (registry responses + the driver's
requests): registry egress at the link.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

from rollstack_bench.link.netem import Built, add_veth, address_up, delete_netns, get_profile, sh, shape
from rollstack.errors import RuntimeFailure

NS_PREFIX = "rs-bcl-"


@dataclass(frozen=True)
class NodeNet:
    netns: str
    ip: str
    node_if: str  # inside the node's namespace
    bridge_if: str  # its peer, in the fabric namespace

    @property
    def env(self) -> dict[str, str]:
        """For the Ray node's raylet (inherited by its actors): where the node agent runs."""
        return {"ROLLSTACK_NETNS": self.netns, "ROLLSTACK_NODE_IP": self.ip}


class Fabric(Built):
    def __init__(self, nodes: int, profile: str = "dc") -> None:
        if not 1 <= nodes <= 200:
            raise RuntimeFailure(f"a fabric holds 1..200 nodes, not {nodes}")
        self.profile = get_profile(profile)
        self.n = nodes
        self.tag = f"{os.getpid() % 10000:04d}{random.randrange(100):02d}"
        self.fabric = f"{NS_PREFIX}{self.tag}-fab"
        self.host_if, self.host_peer = f"rsc{self.tag}h", f"rsc{self.tag}hb"
        self.nodes: list[NodeNet] = []
        self.host_ip = ""
        self._made: list[str] = []

    def _subnet(self) -> str:
        used = sh("ip", "-o", "-4", "addr", "show", check=False).stdout
        for third in random.sample(range(256), 256):
            if f" 10.214.{third}." not in used:
                return f"10.214.{third}"
        raise RuntimeFailure("no free /24 in 10.214.0.0/16")

    def _create(self) -> None:
        net = self._subnet()
        self.host_ip = f"{net}.1"
        sh("ip", "netns", "add", self.fabric)
        self._made.append(self.fabric)
        fab = ("ip", "-n", self.fabric)
        sh(*fab, "link", "add", "br0", "type", "bridge")
        sh(*fab, "link", "set", "br0", "up")
        sh(*fab, "link", "set", "lo", "up")
        add_veth(self.host_if, self.host_peer, self.fabric)
        sh(*fab, "link", "set", self.host_peer, "master", "br0", "up")
        address_up(self.host_if, f"{self.host_ip}/24")
        for i in range(self.n):
            nn = NodeNet(f"{NS_PREFIX}{self.tag}-n{i}", f"{net}.{10 + i}", f"rsc{self.tag}n{i}", f"rsc{self.tag}b{i}")
            sh("ip", "netns", "add", nn.netns)
            self._made.append(nn.netns)
            add_veth(nn.bridge_if, nn.node_if, nn.netns)
            sh("ip", "link", "set", nn.bridge_if, "netns", self.fabric)
            sh(*fab, "link", "set", nn.bridge_if, "master", "br0", "up")
            address_up(nn.node_if, f"{nn.ip}/24", nn.netns)
            sh("ip", "-n", nn.netns, "link", "set", "lo", "up")
            # both directions of the node's link: bridge side egress = its downloads
            shape(nn.bridge_if, self.profile.rate_bit, self.fabric)
            shape(nn.node_if, self.profile.rate_bit, nn.netns)
            self.nodes.append(nn)

    def _counter(self, netns: str, ifname: str, which: str) -> int:
        out = sh("ip", "netns", "exec", netns, "cat", f"/sys/class/net/{ifname}/statistics/{which}").stdout
        return int(out.strip())

    def node_rx_bytes(self, i: int) -> int:
        return self._counter(self.fabric, self.nodes[i].bridge_if, "tx_bytes")

    def host_tx_bytes(self) -> int:
        with open(f"/sys/class/net/{self.host_if}/statistics/tx_bytes") as f:
            return int(f.read())

    def counters(self) -> dict[str, object]:
        return {"host_tx_bytes": self.host_tx_bytes(), "node_rx_bytes": [self.node_rx_bytes(i) for i in range(self.n)]}

    def facts(self) -> dict[str, object]:
        return {"profile": self.profile.name, "rate_bit": self.profile.rate_bit, "added_delay_s": 0.0,
                "host_ip": self.host_ip, "nodes": [{"netns": n.netns, "ip": n.ip} for n in self.nodes],
                "mechanism": "per-node netns + veth into one bridge, tc tbf both directions; agents enter "
                             "their netns by nsenter --net (mount namespace shared)"}

    def close(self) -> None:
        for ns in reversed(self._made):
            delete_netns(ns)
        self._made.clear()
        sh("ip", "link", "del", self.host_if, check=False)
