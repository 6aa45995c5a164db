"""The shaped link: namespace + veth + tbf + delay proxy come up, measure as configured, go away."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rollstack_bench.link.netem import LinkProfile, ShapedLink, cleanup_stale, measure

pytestmark = pytest.mark.integration


def _netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


def test_shaped_link_rate_rtt_and_cleanup() -> None:
    profile = LinkProfile("test", 200_000_000, 0.010)
    with ShapedLink(profile) as link:
        assert link.netns in _netns_names()
        # Only loopback and our veth end live in the namespace.
        ns_links = link.run(["ip", "-o", "link"]).stdout
        assert link.ns_if in ns_links and len(ns_links.splitlines()) == 2
        qdisc = link.run(["tc", "qdisc", "show", "dev", link.ns_if]).stdout
        assert "tbf" in qdisc and "200Mbit" in qdisc
        m = measure(link, megabytes=8, pings=10)
        rx = link.rx_bytes()
        sleeper = link.popen([sys.executable, "-c", "import time; time.sleep(600)"])
    # Generous bounds: the point is that shaping and delay are applied at all, on a busy machine.
    assert 0.008 <= m["rtt_s"] <= 0.060, m
    assert 60e6 <= m["throughput_bit"] <= 240e6, m
    assert rx >= 8 << 20
    assert link.netns not in _netns_names()
    assert link.host_if not in _links()
    assert sleeper.poll() is not None  # processes in the namespace were killed


def test_cleanup_on_failure_inside_the_block() -> None:
    with pytest.raises(RuntimeError):
        with ShapedLink("wan") as link:
            name = link.netns
            link.endpoint(5000)  # starts the delay proxy
            proxy = next(iter(link._proxies.values()))[0]
            raise RuntimeError("boom")
    assert name not in _netns_names()
    assert proxy.poll() is not None


def test_cleanup_stale_removes_orphans() -> None:
    # A namespace named after a pid that cannot exist (pid_max is below 2**22).
    orphan = f"rs-bench-{2**22 + 7}-1"
    subprocess.run(["ip", "netns", "add", orphan], check=True)
    try:
        assert orphan in cleanup_stale()
        assert orphan not in _netns_names()
    finally:
        subprocess.run(["ip", "netns", "del", orphan], capture_output=True)
    mine = f"rs-bench-{os.getpid()}-999"
    subprocess.run(["ip", "netns", "add", mine], check=True)
    try:
        assert mine not in cleanup_stale()  # a live process's link is left alone
    finally:
        subprocess.run(["ip", "netns", "del", mine], capture_output=True)
