"""A shaped network link to a private network namespace: where the benchmark registry lives.

`ShapedLink(profile)` creates a network namespace `rs-bench-<pid>-<n>` joined to the host by a
veth pair with addresses in 10.213.0.0/16 (a subnet that exists only on this veth), rate-limits
both directions with `tc` (tbf; this kernel has no netem) and, when the profile has a round-trip
delay, puts a delaying TCP proxy (netem_proxy, its own process) on the host side. Every system
under test reaches the registry the same way: `link.endpoint(port)`.

Everything is torn down on exit, also on failure: processes started in the namespace are
killed, the proxies stopped, the namespace deleted (which deletes the veth pair).
`cleanup_stale()` removes links left behind by a killed benchmark.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Self, Sequence

from rollstack.errors import InvalidRequest, RuntimeFailure

NS_PREFIX = "rs-bench-"
PROXY_OVERHEAD_S = 0.0003


@dataclass(frozen=True, slots=True)
class LinkProfile:
    """Rate in bit/s (each direction) and round-trip time in seconds."""

    name: str
    rate_bit: int
    rtt_s: float

    @property
    def one_way_delay(self) -> float:
        # The proxy hop itself costs ~0.3 ms of round trip on this machine: do not count it twice.
        return max(self.rtt_s - PROXY_OVERHEAD_S, 0.0) / 2


PROFILES: dict[str, LinkProfile] = {
    "lan": LinkProfile("lan", 10_000_000_000, 0.0002),
    "dc": LinkProfile("dc", 1_000_000_000, 0.002),
    "wan": LinkProfile("wan", 200_000_000, 0.020),
}
DEFAULT_PROFILE = "dc"
# Below this RTT the proxy would add more than it emulates (its own hop costs ~0.1 ms).
MIN_PROXIED_RTT = 0.0005


def get_profile(profile: str | LinkProfile) -> LinkProfile:
    if isinstance(profile, LinkProfile):
        return profile
    try:
        return PROFILES[profile]
    except KeyError:
        raise InvalidRequest(f"unknown link profile {profile!r} (one of {', '.join(PROFILES)})") from None


def tbf_burst_bytes(rate_bit: int) -> int:
    """Bucket size: 2 ms at line rate, at least 256 KiB so 64 KiB GSO segments always pass."""
    return max(rate_bit // 8 // 500, 256 * 1024)


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `ip`/`tc`/...; RuntimeFailure with its stderr when `check` and it fails."""
    proc = subprocess.run(list(args), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeFailure(f"{' '.join(args)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def in_netns(netns: str | None, *args: str) -> tuple[str, ...]:
    """`args` run inside `netns` (None: this namespace)."""
    return ("ip", "netns", "exec", netns, *args) if netns else args


def add_veth(outer: str, inner: str, netns: str) -> None:
    """A veth pair: `outer` stays in this namespace, its peer `inner` moves into `netns`."""
    sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
    sh("ip", "link", "set", inner, "netns", netns)


def address_up(ifname: str, cidr: str, netns: str | None = None) -> None:
    """Give `ifname` (in `netns`, None: here) the address `cidr` and bring it up."""
    sh(*in_netns(netns, "ip", "addr", "add", cidr, "dev", ifname))
    sh(*in_netns(netns, "ip", "link", "set", ifname, "up"))


def shape(ifname: str, rate_bit: int, netns: str | None = None) -> None:
    """Rate-limit the egress of `ifname` (in `netns`, None: here) to `rate_bit` with tc tbf."""
    sh(*in_netns(netns, "tc", "qdisc", "replace", "dev", ifname, "root", "tbf", "rate", str(rate_bit),
                 "burst", str(tbf_burst_bytes(rate_bit)), "latency", "50ms"))


def delete_netns(name: str) -> None:
    """Kill what still runs in the network namespace `name`, then delete it (and its veths)."""
    for pid in sh("ip", "netns", "pids", name, check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    sh("ip", "netns", "del", name, check=False)


class Built:
    """A context manager over what `_create` builds and `close` tears down, also when `_create`
    fails half-way (`close` must cope with a partial build)."""

    def __enter__(self) -> Self:
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def _used_subnets() -> set[int]:
    out = sh("ip", "-o", "-4", "addr", "show", check=False).stdout
    used = set()
    for line in out.splitlines():
        for tok in line.split():
            if tok.startswith("10.213."):
                parts = tok.split("/")[0].split(".")
                used.add(int(parts[2]) * 64 + int(parts[3]) // 4)
    return used


class ShapedLink(Built):
    """Context manager: a shaped veth to a fresh network namespace."""

    _counter = 0

    def __init__(self, profile: str | LinkProfile = DEFAULT_PROFILE) -> None:
        self.profile = get_profile(profile)
        ShapedLink._counter += 1
        self.netns = f"{NS_PREFIX}{os.getpid()}-{ShapedLink._counter}"
        tag = f"{os.getpid() % 100000}{ShapedLink._counter % 10}"
        self.host_if, self.ns_if = f"rsb{tag}h", f"rsb{tag}n"  # <= 15 chars
        self.host_ip = self.ns_ip = ""
        self._procs: list[subprocess.Popen[bytes]] = []
        self._proxies: dict[int, tuple[subprocess.Popen[bytes], int]] = {}
        self._up = False

    # -- lifecycle -------------------------------------------------------------------------
    def _create(self) -> None:
        used = _used_subnets()
        start = (os.getpid() * 7 + ShapedLink._counter) % 16384
        block = next((b for b in ((start + i) % 16384 for i in range(16384)) if b not in used), None)
        if block is None:
            raise RuntimeFailure("no free /30 in 10.213.0.0/16")
        third, fourth = divmod(block, 64)
        base = f"10.213.{third}.{fourth * 4}"
        self.host_ip = base[: base.rfind(".") + 1] + str(fourth * 4 + 1)
        self.ns_ip = base[: base.rfind(".") + 1] + str(fourth * 4 + 2)
        sh("ip", "netns", "add", self.netns)
        self._up = True
        add_veth(self.host_if, self.ns_if, self.netns)
        address_up(self.host_if, f"{self.host_ip}/30")
        address_up(self.ns_if, f"{self.ns_ip}/30", self.netns)
        self._ns("ip", "link", "set", "lo", "up")
        # Shape both directions: ns egress is the download path (registry -> client).
        shape(self.host_if, self.profile.rate_bit)
        shape(self.ns_if, self.profile.rate_bit, self.netns)

    def _ns(self, *args: str) -> subprocess.CompletedProcess[str]:
        return sh("ip", "netns", "exec", self.netns, *args)

    def close(self) -> None:
        for proc, _ in self._proxies.values():
            _stop(proc)
        self._proxies.clear()
        for proc in self._procs:
            _stop(proc)
        self._procs.clear()
        if self._up:
            # Anything else still running in the namespace (children of what we started).
            delete_netns(self.netns)
            self._up = False
        sh("ip", "link", "del", self.host_if, check=False)

    # -- use -------------------------------------------------------------------------------
    def popen(self, argv: Sequence[str], **kwargs: object) -> subprocess.Popen[bytes]:
        """Start a process inside the namespace; it is killed when the link closes."""
        if not self._up:
            raise RuntimeFailure("link is not up")
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(["ip", "netns", "exec", self.netns, *argv], **kwargs)  # type: ignore[call-overload]
        self._procs.append(proc)
        return proc

    def run(self, argv: Sequence[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run a command inside the namespace to completion."""
        return subprocess.run(["ip", "netns", "exec", self.netns, *argv], capture_output=True, text=True, timeout=timeout)

    def endpoint(self, port: int) -> str:
        """`host:port` clients on the host use to reach `port` inside the namespace."""
        if self.profile.rtt_s < MIN_PROXIED_RTT:
            return f"{self.ns_ip}:{port}"
        if port not in self._proxies:
            self._proxies[port] = self._start_proxy(port)
        return f"127.0.0.1:{self._proxies[port][1]}"

    def _start_proxy(self, port: int) -> tuple[subprocess.Popen[bytes], int]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rollstack_bench.link.proxy", "127.0.0.1", "0", self.ns_ip, str(port),
             repr(self.profile.one_way_delay)],
            stdout=subprocess.PIPE, start_new_session=True,
        )
        line = proc.stdout.readline().decode() if proc.stdout else ""
        if not line.startswith("ready "):
            _stop(proc)
            raise RuntimeFailure(f"delay proxy did not start: {line!r}")
        return proc, int(line.split()[1])

    def rx_bytes(self) -> int:
        """Bytes the host received over the link so far (everything pulled from the namespace)."""
        return int(Path(f"/sys/class/net/{self.host_if}/statistics/rx_bytes").read_text())

    def facts(self) -> dict[str, object]:
        return {"profile": self.profile.name, "rate_bit": self.profile.rate_bit, "rtt_s": self.profile.rtt_s,
                "netns": self.netns, "ns_ip": self.ns_ip, "shaping": "tc tbf both directions",
                "delay": "TCP proxy" if self.profile.rtt_s >= MIN_PROXIED_RTT else "none (veth)"}


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    for stream in (proc.stdout, proc.stderr, proc.stdin):
        if stream is not None:
            stream.close()


def cleanup_stale() -> list[str]:
    """Delete benchmark namespaces whose creating process is gone; returns their names."""
    removed = []
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(NS_PREFIX):
            continue
        try:
            pid = int(name[len(NS_PREFIX):].split("-")[0])
        except ValueError:
            continue
        if _alive(pid):
            continue
        delete_netns(name)
        removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def measure(link: ShapedLink, megabytes: int = 32, pings: int = 20) -> dict[str, float]:
    """Measured RTT (median of small ping-pongs) and download throughput over the link."""
    from rollstack_bench.link.probe import measure_link

    return measure_link(link, megabytes=megabytes, pings=pings)


def wait_port(host: str, port: int, timeout: float = 10.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"nothing listens on {host}:{port} after {timeout:.0f}s") from None
            time.sleep(0.05)
