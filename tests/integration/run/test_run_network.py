"""Network modes of real environments: veth + nftables policy, tested against netns of our own."""

from __future__ import annotations

import socket
import threading
import uuid
from pathlib import Path

import pytest

from rollstack.plan.network import parse_allow
from rollstack.run.network import NetworkSpec, leftovers, resolve_spec
from rollstack.run.ocispec import SpecParams

from rollstack_bench.netlab import Upstream, sh

pytestmark = pytest.mark.integration


@pytest.fixture
def www(tmp_path: Path) -> Path:
    d = tmp_path / "www"
    d.mkdir()
    (d / "hello").write_text("hello from upstream\n")
    return d


@pytest.fixture
def upstream(www: Path):
    up = Upstream(www)
    try:
        up.serve(8000)
        up.serve(8001)
        yield up
    finally:
        up.close()


@pytest.fixture
def metadata(www: Path):
    """A stand-in for a cloud metadata service at 169.254.169.254, in a netns of ours."""
    md = Upstream(www, address="169.254.169.254")
    try:
        md.serve(80)
        yield md
    finally:
        md.close()


@pytest.fixture
def net_env(make_env):
    def make(mode: str = "allow", allow: list[str] = (), expose: list[int] = ()):
        return make_env(network=resolve_spec(mode, [parse_allow(a) for a in allow], expose), prefix="n")

    return make


def fetch(env, url: str) -> tuple[int, str]:
    r = env.exec(f"timeout 3 wget -q -O - {url}", timeout=20)
    return r.exit_code, r.stdout.decode()


def test_allow_reaches_listed_endpoint_only(net_env, upstream, metadata):
    env = net_env("allow", [f"{upstream.addr}:8000"])
    assert fetch(env, f"http://{upstream.addr}:8000/hello") == (0, "hello from upstream\n")
    assert fetch(env, f"http://{upstream.addr}:8001/hello")[0] != 0  # same host, other port
    # The node's own addresses (the gateway, the upstream link's host end) are not the endpoint.
    assert fetch(env, f"http://{env.net.gateway}:8000/")[0] != 0
    assert fetch(env, f"http://{upstream.host_addr}:8000/")[0] != 0
    # The metadata stand-in is reachable from the host, never from the environment.
    assert sh("timeout", "3", "busybox", "wget", "-q", "-O", "-",
              "http://169.254.169.254/hello").stdout == "hello from upstream\n"
    assert fetch(env, "http://169.254.169.254/hello")[0] != 0


def test_allow_host_entry_reaches_the_node_on_that_port_only(net_env):
    port = _free_port()
    env = net_env("allow", [f"host:{port}"])
    gw = env.net.gateway
    srv, other = _tcp_server(gw, port), _tcp_server(gw, 0)
    try:
        r = env.exec(f"echo hi | nc -w 2 {gw} {port}", timeout=20)
        assert r.exit_code == 0 and r.stdout == b"pong\n"
        r = env.exec(f"echo hi | nc -w 2 {gw} {other.getsockname()[1]}", timeout=20)
        assert r.stdout == b""
    finally:
        srv.close()
        other.close()


def test_outbound_nat_but_no_metadata_node_or_neighbours(net_env, upstream, metadata):
    env = net_env("outbound")
    other = net_env("outbound")
    assert fetch(env, f"http://{upstream.addr}:8000/hello") == (0, "hello from upstream\n")
    assert fetch(env, f"http://{upstream.addr}:8001/hello")[0] == 0
    assert fetch(env, "http://169.254.169.254/hello")[0] != 0
    # a neighbour listening on all its addresses is unreachable, and so is the node itself
    other.exec("httpd -p 8000 -h /etc")
    assert fetch(other, "http://127.0.0.1:8000/passwd")[0] == 0
    assert fetch(env, f"http://{other.net.address}:8000/passwd")[0] != 0
    srv = _tcp_server(env.net.gateway, 0)
    try:
        r = env.exec(f"echo hi | nc -w 2 {env.net.gateway} {srv.getsockname()[1]}", timeout=20)
        assert r.stdout == b""
    finally:
        srv.close()
    # masqueraded: the upstream sees the node's address, not the environment's
    assert env.net.address not in sh("ip", "netns", "exec", upstream.netns, "cat",
                                     "/proc/net/nf_conntrack", check=False).stdout


def test_none_has_no_interface_but_loopback(net_env, upstream):
    env = net_env("none")
    assert env.net is None
    dev = env.exec("cat /proc/net/dev").stdout.decode().splitlines()[2:]
    assert [line.split(":")[0].strip() for line in dev] == ["lo"]
    assert fetch(env, f"http://{upstream.addr}:8000/hello")[0] != 0


def test_environment_cannot_change_its_network(net_env, upstream):
    env = net_env("allow", [f"{upstream.addr}:8000"])
    for cmd in ("ip addr add 10.213.255.250/30 dev eth0", "ip link set eth0 down",
                "ip route del default", f"ip addr del {env.net.address}/30 dev eth0",
                "ip link add dummy0 type dummy"):
        r = env.exec(cmd)
        assert r.exit_code != 0, cmd
    assert fetch(env, f"http://{upstream.addr}:8000/hello")[0] == 0
    # the table lives in the host's netns, where the environment has no presence at all
    assert sh("nft", "list", "table", "inet", f"rsn_{env.net.slot}").returncode == 0


def test_create_destroy_cycles_leak_nothing(runtime, busybox_lower, upstream):
    spec = resolve_spec("allow", [parse_allow(f"{upstream.addr}:8000")], [8080])
    slots = set()
    for i in range(20):
        env_id = f"c-{i}-{uuid.uuid4().hex[:8]}"
        env = runtime.create(env_id, [busybox_lower], SpecParams(env_id), network=spec)
        slots.add(env.net.slot)
        env.destroy()
    left = leftovers(sorted(slots))
    assert left == {"interfaces": [], "netns": [], "tables": [], "addresses": []}
    assert not [s for s in slots if Path(runtime.network.state_dir, "slots", str(s)).exists()]


def test_failed_setup_leaves_nothing(runtime, busybox_lower, monkeypatch):
    from rollstack.errors import RuntimeFailure
    from rollstack.run import network

    real = network._nft

    def broken(script: str) -> None:  # loading a policy fails; removing tables still works
        if "chain from_env" in script:
            raise RuntimeFailure("nft failed: injected")
        real(script)

    monkeypatch.setattr(network, "_nft", broken)
    env_id = f"f-{uuid.uuid4().hex[:8]}"
    with pytest.raises(RuntimeFailure, match="injected"):
        runtime.create(env_id, [busybox_lower], SpecParams(env_id), network=NetworkSpec("outbound"))
    assert not runtime.env_dir(env_id).exists()
    owned = runtime.network.owned(f"{runtime.root}:")
    assert owned == []
    assert not [n for n in sh("ip", "netns", "list").stdout.split() if n.startswith("rsn-")
                and n in {f"rsn-{s}" for s in owned}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tcp_server(addr: str, port: int) -> socket.socket:
    """Answers `pong` to every connection, until closed."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, port))
    srv.listen(8)

    def loop() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            with c:
                c.sendall(b"pong\n")

    threading.Thread(target=loop, daemon=True).start()
    return srv


def test_warm_pool_slots_serve_creates_and_are_removed_on_close(tmp_path, busybox_lower, upstream):
    import json
    import time

    from rollstack.run.environment import EnvironmentRuntime, RuntimeConfig

    rt = EnvironmentRuntime(RuntimeConfig(root=tmp_path / "rt-warm", network_warm=2, subreaper=False))
    rt.start_network_pool(lazy=False)
    try:
        end = time.monotonic() + 30
        while len(rt.network.owned(f"{rt.root}:warm")) < 2 and time.monotonic() < end:
            time.sleep(0.05)
        warm = rt.network.owned(f"{rt.root}:warm")
        assert len(warm) == 2
        # a prepared slot drops everything until a policy is loaded
        table = sh("nft", "list", "table", "inet", f"rsn_{warm[0]}").stdout
        assert "dport" not in table and "masquerade" not in table and "jump beyond" in table
        spec = resolve_spec("allow", [parse_allow(f"{upstream.addr}:8000")], [])
        env = rt.create("w-1", [busybox_lower], SpecParams("w-1"), network=spec,
                            userns=False)  # user-namespaced creates take no warm slot
        try:
            assert env.net.slot in warm
            doc = json.loads(Path(rt.network.state_dir, "slots", str(env.net.slot)).read_text())
            assert doc["owner"] == f"{rt.root}:w-1" and doc["warm"]
            assert fetch(env, f"http://{upstream.addr}:8000/hello") == (0, "hello from upstream\n")
            assert fetch(env, f"http://{upstream.addr}:8001/hello")[0] != 0
        finally:
            env.destroy()
    finally:
        rt.close()
        rt.cleanup_leftovers()
    assert rt.network.owned(f"{rt.root}:") == []
    slots = set(warm) | {env.net.slot if env.net else -1}
    assert leftovers(sorted(s for s in slots if s >= 0)) == \
        {"interfaces": [], "netns": [], "tables": [], "addresses": []}


def test_allowed_names_resolve_inside_through_etc_hosts(net_env, upstream, monkeypatch):
    """`allow` has no DNS: an allowed name is resolved at create and written to /etc/hosts
    (the name here is answered by a stand-in resolver; the traffic is real)."""
    import socket

    real = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda name, *a, **kw: real(
        upstream.addr if name == "model.rollstack-test" else name, *a, **kw))
    env = net_env("allow", ["model.rollstack-test:8000"])
    assert fetch(env, "http://model.rollstack-test:8000/hello") == (0, "hello from upstream\n")
    assert fetch(env, "http://model.rollstack-test:8001/hello")[0] != 0  # only the allowed port
    hosts = env.exec("cat /etc/hosts").stdout.decode()
    assert f"{upstream.addr}\tmodel.rollstack-test" in hosts
    assert env.exec("stat -c %u /etc/hosts").stdout.strip() == b"0"  # root's, also under userns
