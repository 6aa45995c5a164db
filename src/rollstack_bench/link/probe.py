"""Verify a shaped link: a tiny TCP server inside the namespace, RTT and throughput from the host.

Protocol (one connection each): `p` -> the server answers one byte (ping); `d<n>\\n` -> the server
sends n bytes then closes (download). Server: `python -m rollstack_bench.link.probe PORT`
(prints `ready` once listening).
"""

from __future__ import annotations

import socket
import socketserver
import statistics
import subprocess
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rollstack_bench.link.netem import ShapedLink

_BLOCK = b"\0" * (1 << 20)


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            op = sock.recv(1)
            if not op:
                return
            if op == b"p":
                sock.sendall(b"P")
            elif op == b"d":
                buf = b""
                while not buf.endswith(b"\n"):
                    more = sock.recv(32)
                    if not more:
                        return
                    buf += more
                left = int(buf)
                while left > 0:
                    n = min(left, len(_BLOCK))
                    sock.sendall(_BLOCK[:n])
                    left -= n
                return


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


def serve(port: int) -> None:
    with _Server(("0.0.0.0", port), _Handler) as srv:
        print("ready", flush=True)
        srv.serve_forever()


def measure_link(link: "ShapedLink", megabytes: int = 32, pings: int = 20, port: int = 18999) -> dict[str, float]:
    proc = link.popen([sys.executable, "-m", "rollstack_bench.link.probe", str(port)], stdout=subprocess.PIPE)
    try:
        if proc.stdout is None or proc.stdout.readline().strip() != b"ready":
            raise RuntimeError("probe server did not start")
        host, p = link.endpoint(port).rsplit(":", 1)
        rtts = []
        with socket.create_connection((host, int(p)), timeout=10) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(pings + 2):
                t = time.perf_counter()
                s.sendall(b"p")
                if s.recv(1) != b"P":
                    raise RuntimeError("bad ping answer")
                rtts.append(time.perf_counter() - t)
        rtts = rtts[2:]  # the first exchanges include connection set-up
        size = megabytes << 20
        t = time.perf_counter()
        got = 0
        with socket.create_connection((host, int(p)), timeout=30) as s:
            s.sendall(b"d%d\n" % size)
            while True:
                chunk = s.recv(1 << 20)
                if not chunk:
                    break
                got += len(chunk)
        secs = time.perf_counter() - t
        return {"rtt_s": statistics.median(rtts), "rtt_min_s": min(rtts), "throughput_bit": got * 8 / secs,
                "bytes": got, "seconds": secs}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
        if proc.stdout:
            proc.stdout.close()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
