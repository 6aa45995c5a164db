"""PeerClient: peers ordered before this node are asked to wait for an in-flight chunk at any
stage, peers after it only at the registry stage (no wait cycle); set_urls replaces the peer set."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from rollstack.fetch.peers import PeerClient


def _peer(seen: list[str], status: int = 404):
    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            seen.append(self.path)
            self.send_response(status)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *a) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def test_earlier_peers_wait_at_any_stage_later_ones_at_the_registry_stage() -> None:
    seen_a: list[str] = []
    seen_b: list[str] = []
    sa, a = _peer(seen_a)
    sb, b = _peer(seen_b, status=200)
    try:
        low = min(a, b)
        client = PeerClient([a, b], self_url=max(a, b))  # `low` sorts before us, the other is us-equal
        d = "sha256:" + "0" * 64
        got = client.get(d)
        assert got is not None and got[1] == b
        asked_low = seen_a if a == low else seen_b
        asked_high = seen_b if a == low else seen_a
        assert asked_low and "wait=" in asked_low[0] and "stage=" not in asked_low[0]
        assert all("stage=registry" in p for p in asked_high)
        client.set_urls([a, b], self_url=min(a, b))  # both peers sort at or after us: registry stage only
        seen_a.clear()
        seen_b.clear()
        client.get(d)
        assert seen_a + seen_b and all("stage=registry" in p for p in seen_a + seen_b)
        plain = PeerClient([a], self_url=None)  # no order known: a plain ask
        plain.get(d)
        plain.close()
        assert "wait=" not in seen_a[-1]
        client.set_urls([], None)
        assert client.get(d) is None and client.urls == []
        client.close()
    finally:
        sa.shutdown()
        sb.shutdown()
