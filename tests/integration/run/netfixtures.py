"""Test-only network namespaces standing in for the world outside a node.

`Upstream`: a netns of our own (`rsntest-<hex>`) behind a veth whose host end is
10.214.X.1/30 and whose far end is 10.214.X.2 (`.addr`), or, with `address=`, a netns carrying
that address (e.g. 169.254.169.254, a stand-in metadata service: the host routes that one /32 to
our veth, never to a real one). `serve(port)` runs busybox httpd inside it on a directory of
files; everything is removed by `close()`.
"""

from __future__ import annotations

import ipaddress
import secrets
import subprocess
import time
from pathlib import Path


def sh(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=30, **kw)


class Upstream:
    def __init__(self, www: Path, address: str | None = None) -> None:
        tag = secrets.token_hex(3)
        self.netns, self.host_if = f"rsntest-{tag}", f"rsu{tag}"
        x = int(tag, 16) % 16000
        base = ipaddress.IPv4Address("10.214.0.0") + 4 * x
        self.host_addr = str(base + 1)
        self.addr = address or str(base + 2)
        self.www = www
        self.procs: list[subprocess.Popen] = []
        sh("ip", "netns", "add", self.netns)
        try:
            sh("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", "eth0",
               "netns", self.netns)
            sh("ip", "addr", "add", f"{self.host_addr}/30", "dev", self.host_if)
            sh("ip", "link", "set", self.host_if, "up")
            Path(f"/proc/sys/net/ipv4/conf/{self.host_if}/forwarding").write_text("1")
            n = ["ip", "-n", self.netns]
            sh(*n, "link", "set", "lo", "up")
            sh(*n, "link", "set", "eth0", "up")
            if address is None:
                sh(*n, "addr", "add", f"{self.addr}/30", "dev", "eth0")
            else:
                sh(*n, "addr", "add", f"{self.addr}/32", "dev", "eth0")
                sh(*n, "route", "add", f"{self.host_addr}/32", "dev", "eth0")
                sh("ip", "route", "add", f"{self.addr}/32", "dev", self.host_if)
            sh(*n, "route", "add", "default", "via", self.host_addr)
        except BaseException:
            self.close()
            raise

    def run(self, *argv: str, **kw) -> subprocess.Popen:
        p = subprocess.Popen(["ip", "netns", "exec", self.netns, *argv],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
        self.procs.append(p)
        return p

    def serve(self, port: int) -> None:
        self.run("busybox", "httpd", "-f", "-p", f"{self.addr}:{port}", "-h", str(self.www))
        wait_port(self.netns, self.addr, port)

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        sh("ip", "link", "del", self.host_if, check=False)
        sh("ip", "netns", "del", self.netns, check=False)


def wait_port(netns: str | None, addr: str, port: int, timeout: float = 5.0) -> None:
    pre = ["ip", "netns", "exec", netns] if netns else []
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        probe = f"import socket; socket.create_connection(({addr!r}, {port}), 1).close()"
        if sh(*pre, "python3", "-c", probe, check=False).returncode == 0:
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {addr}:{port} in {netns or 'the host'}")
