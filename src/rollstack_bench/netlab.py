"""Network namespaces of our own standing in for the world outside a node (tests, benchmarks).

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


MODEL_SERVER = r'''
import json, socketserver, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

addr, port, reply, log = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]


class H(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        with open(log, "a") as f:
            f.write(json.dumps({"path": self.path, "auth": self.headers.get("authorization"),
                                "model": body.get("model"),
                                "messages": body.get("messages")}) + "\n")
        if self.path.rstrip("/") != "/v1/chat/completions":
            self.send_response(404); self.end_headers(); return
        # a JSON list: a script, one reply per call of a conversation (picked by how many
        # assistant turns the request already carries: stateless, so retries are harmless)
        turns = json.loads(reply) if reply.startswith("[") else [reply]
        done = sum(1 for m in body.get("messages") or [] if m.get("role") == "assistant")
        content = turns[min(done, len(turns) - 1)]
        doc = {"id": "chatcmpl-scripted", "object": "chat.completion", "model": body.get("model"),
               "created": 0, "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
               "choices": [{"index": 0, "finish_reason": "stop",
                            "message": {"role": "assistant", "content": content}}]}
        data = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


class Server(HTTPServer):
    def server_bind(self):  # HTTPServer's own looks up the FQDN: no DNS in our netns
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = addr, port


Server((addr, port), H).serve_forever()
'''


def serve_model(up: Upstream, port: int, reply: str, log: Path) -> None:
    """A scripted OpenAI-compatible `/v1/chat/completions` in `up`'s netns: every call answers
    `reply` (or, for a JSON list, its item number <assistant turns so far>) as the assistant message and appends the request (path, Authorization, messages)
    to `log` as a JSON line."""
    script = up.www.parent / f"model-server-{port}.py"
    script.write_text(MODEL_SERVER)
    up.run("python3", str(script), up.addr, str(port), reply, str(log))
    wait_port(up.netns, up.addr, port)
