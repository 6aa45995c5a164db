"""`bench cluster`'s per-node network namespaces (rollstack_bench.cluster_net) on this machine:
each node's own tc-shaped veth into one bridge; the host (registry) and the other nodes reached
only through it; bytes counted per node link; nothing left after close."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest

from rollstack_bench.cluster_net import Fabric

pytestmark = pytest.mark.integration

PULL = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
n = 0
while True:
    b = s.recv(65536)
    if not b:
        break
    n += len(b)
print(n)
"""


def _serve(host: str, payload: bytes) -> int:
    srv = socket.socket()
    srv.bind((host, 0))
    srv.listen()

    def one() -> None:
        conn, _ = srv.accept()
        conn.sendall(payload)
        conn.close()
        srv.close()

    threading.Thread(target=one, daemon=True).start()
    return srv.getsockname()[1]


def _in(netns: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nsenter", f"--net=/run/netns/{netns}", "--", *argv], capture_output=True, text=True,
                          timeout=60)


def test_each_node_has_its_own_shaped_link_and_close_leaves_nothing() -> None:
    with Fabric(2, "dc") as fab:
        a, b = fab.nodes
        names = {n.netns for n in fab.nodes} | {fab.fabric}
        assert names <= set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
        for n in fab.nodes:  # shaped both ways at the profile's rate
            down = subprocess.run(["ip", "netns", "exec", fab.fabric, "tc", "qdisc", "show", "dev", n.bridge_if],
                                  capture_output=True, text=True).stdout
            up = subprocess.run(["ip", "netns", "exec", n.netns, "tc", "qdisc", "show", "dev", n.node_if],
                                capture_output=True, text=True).stdout
            assert "tbf" in down and "rate 1Gbit" in down and "tbf" in up
        # the host's side (where the registry listens) -> node a, counted on a's link only
        before = fab.counters()
        port = _serve(fab.host_ip, b"x" * 3_000_000)
        got = _in(a.netns, sys.executable, "-c", PULL, fab.host_ip, str(port))
        assert got.stdout.strip() == "3000000", got.stderr
        after = fab.counters()
        assert after["node_rx_bytes"][0] - before["node_rx_bytes"][0] >= 3_000_000
        assert after["node_rx_bytes"][1] - before["node_rx_bytes"][1] < 100_000
        assert after["host_tx_bytes"] - before["host_tx_bytes"] >= 3_000_000
        # node b -> node a (a peer fetch) crosses both links, not the host's
        srv = _in(b.netns, sys.executable, "-c", "import socket; s=socket.socket(); print(s.connect_ex(('%s', 9)))" % a.ip)
        assert srv.returncode == 0 and srv.stdout.strip() in ("111", "0")  # refused = reached a's stack
        # a node's own loopback is its own: the host's 127.0.0.1 services are not there
        host_port = _serve("127.0.0.1", b"y")
        probe = _in(a.netns, sys.executable, "-c",
                    f"import socket; s=socket.socket(); print(s.connect_ex(('127.0.0.1', {host_port})))")
        assert probe.stdout.strip() != "0"
    left = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    assert not names & left
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert fab.host_if not in links
