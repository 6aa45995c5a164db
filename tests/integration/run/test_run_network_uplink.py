"""`outbound` past the node: NAT'd egress through an uplink the node's config names
(`network_uplinks`), with a network namespace of ours playing "the internet"."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from rollstack_bench.netlab import Upstream, sh
from rollstack.errors import RuntimeFailure
from rollstack.run.environment import EnvironmentRuntime, RuntimeConfig
from rollstack.run.network import NetworkManager, resolve_spec
from rollstack.run.ocispec import SpecParams

pytestmark = pytest.mark.integration


def _forwarding(interface: str) -> str:
    return Path(f"/proc/sys/net/ipv4/conf/{interface}/forwarding").read_text().strip()


@pytest.fixture
def internet(tmp_path: Path):
    """A host on TEST-NET-2 (198.51.100.0/24, never routed for real), reached through an uplink
    veth whose forwarding starts off, and with no route back to the environments' pool: only
    NAT'd traffic (source = the uplink's address) can get a reply."""
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "hello").write_text("from the internet\n")
    up = Upstream(tmp_path / "www", address=f"198.51.100.{2 + secrets.randbelow(250)}")
    try:
        sh("ip", "-n", up.netns, "route", "del", "default")
        Path(f"/proc/sys/net/ipv4/conf/{up.host_if}/forwarding").write_text("0")
        up.serve(8080)
        yield up
    finally:
        up.close()


def test_outbound_is_natted_out_of_the_configured_uplink(tmp_path, busybox_lower, internet):
    rt = EnvironmentRuntime(RuntimeConfig(root=tmp_path / "rt", subreaper=False,
                                          network_uplinks=(internet.host_if,)))
    try:
        assert _forwarding(internet.host_if) == "0"
        env = rt.create("up-1", [busybox_lower], SpecParams("up-1"),
                        network=resolve_spec("outbound", [], []))
        try:
            assert _forwarding(internet.host_if) == "1"  # switched on by the create, for it only
            r = env.exec(f"timeout 5 wget -q -O - http://{internet.addr}:8080/hello", timeout=20)
            assert (r.exit_code, r.stdout) == (0, b"from the internet\n"), r
        finally:
            env.destroy()
        assert rt.network.owned(f"{rt.root}:") == []
    finally:
        rt.cleanup_leftovers()


def test_allow_egress_works_with_default_settings(tmp_path, busybox_lower, internet):
    """No uplink configured: the create finds the interface the kernel routes the allowed
    destination through and switches its forwarding on. (`outbound` takes the default routes'
    interfaces the same way: tests/unit/run/test_run_uplinks.py; not switched on here, where
    the default route is this machine's real uplink.)"""
    from rollstack.plan.network import parse_allow

    rt = EnvironmentRuntime(RuntimeConfig(root=tmp_path / "rt", subreaper=False))
    try:
        assert _forwarding(internet.host_if) == "0"
        spec = resolve_spec("allow", [parse_allow(f"{internet.addr}:8080")], [])
        assert rt.network.uplinks(spec) == [internet.host_if]
        env = rt.create("up-3", [busybox_lower], SpecParams("up-3"), network=spec)
        try:
            assert _forwarding(internet.host_if) == "1"
            r = env.exec(f"timeout 5 wget -q -O - http://{internet.addr}:8080/hello", timeout=20)
            assert (r.exit_code, r.stdout) == (0, b"from the internet\n"), r
        finally:
            env.destroy()
    finally:
        rt.cleanup_leftovers()


def test_an_uplink_must_be_an_interface_name():
    for bad in ("../../kernel/x", "eth0/forwarding", "", "a" * 16):
        with pytest.raises(RuntimeFailure, match="is not an interface name"):
            NetworkManager(forward_interfaces=(bad,))


def test_a_missing_uplink_fails_the_create_clearly(tmp_path, busybox_lower):
    rt = EnvironmentRuntime(RuntimeConfig(root=tmp_path / "rt", subreaper=False,
                                          network_uplinks=("rsnogone0",)))
    try:
        with pytest.raises(RuntimeFailure, match="rsnogone0"):
            rt.create("up-2", [busybox_lower], SpecParams("up-2"), network=resolve_spec("outbound", [], []))
        assert not rt.env_dir("up-2").exists()
        assert rt.network.owned(f"{rt.root}:") == []
    finally:
        rt.cleanup_leftovers()
