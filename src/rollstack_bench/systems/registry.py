"""The benchmark registry: Debian's docker-registry running inside a ShapedLink's namespace.

Every system under test pulls from this one registry through the same shaped link. Its data
directory persists between runs (pushed images are reused; pushes of existing blobs are cheap).
"""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import yaml

from rollstack_bench.link.netem import ShapedLink, wait_port
from rollstack.errors import RegistryUnavailable

REGISTRY_BINARY = "/usr/bin/docker-registry"
PORT = 5000


class NetnsRegistry:
    """Context manager: docker-registry on `<ns_ip>:5000` inside `link`'s namespace."""

    def __init__(self, link: ShapedLink, root: Path) -> None:
        self.link = link
        self.root = root
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> "NetnsRegistry":
        self.root.mkdir(parents=True, exist_ok=True)
        cfg = {
            "version": 0.1,
            "log": {"level": "warn", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(self.root / "data")}, "delete": {"enabled": True},
                        "maintenance": {"uploadpurging": {"enabled": False}}},
            "http": {"addr": f"0.0.0.0:{PORT}", "secret": secrets.token_hex(16)},
        }
        path = self.root / "config.yml"
        path.write_text(yaml.safe_dump(cfg))
        log = open(self.root / "registry.log", "ab")
        try:
            self._proc = self.link.popen([REGISTRY_BINARY, "serve", str(path)], stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        try:
            wait_port(self.link.ns_ip, PORT, timeout=20)
        except Exception as exc:
            raise RegistryUnavailable(f"docker-registry in {self.link.netns} did not start: {exc}") from exc
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    @property
    def address(self) -> str:
        """host:port clients use (through the link's delay proxy when the profile has one)."""
        return self.link.endpoint(PORT)

    @property
    def url(self) -> str:
        return f"http://{self.address}"
