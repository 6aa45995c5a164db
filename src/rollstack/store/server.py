"""`RegistryServer`: runs Debian's `docker-registry` (CNCF distribution) with a generated config.

Used by the test fixtures and by `rollstack registry serve`. The config puts filesystem storage
under `root/data`, enables deletes, and (optionally) htpasswd or token auth. Port 0 picks a free
loopback port (the registry cannot report the port it bound, so we choose one and retry on the
rare race with another process). `start()` returns once `GET /v2/` answers; `stop()` always
reaps the process (terminate, wait, kill). The registry's log goes to `root/registry.log`.
"""

from __future__ import annotations

import errno
import os
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from rollstack.errors import InvalidRequest, RegistryUnavailable

DEFAULT_BINARY = "/usr/bin/docker-registry"
SETPRIV = "/usr/bin/setpriv"  # util-linux (essential); sets the parent-death signal, then execs


def _bcrypt(password: str, cost: int) -> str:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # glibc/libxcrypt does bcrypt; the only hash docker-registry accepts

    return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=1 << cost))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _port_free(host: str, port: int) -> bool:
    """False if something listens there; InvalidRequest if the host cannot be bound at all."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise InvalidRequest(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return True


def parse_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not (0 <= int(port) < 65536):
        raise InvalidRequest(f"invalid address {addr!r} (want HOST:PORT)")
    return host or "127.0.0.1", int(port)


class RegistryServer:
    """A docker-registry process. Context manager; `.url` once started."""

    def __init__(
        self,
        root: Path | str,
        addr: str = "127.0.0.1:0",
        *,
        htpasswd: dict[str, str] | None = None,
        htpasswd_cost: int = 10,
        auth: dict[str, Any] | None = None,
        binary: str = DEFAULT_BINARY,
        log_level: str = "warn",
        start_timeout: float = 20.0,
        die_with_parent: bool = False,
    ) -> None:
        self.root = Path(root).expanduser().absolute()
        self.host, self.port = parse_addr(addr)
        self.htpasswd = htpasswd  # user -> password; the registry checks bcrypt on every request
        self.htpasswd_cost = htpasswd_cost  # so tests use a low cost (4) to stay fast
        self.auth = auth  # a raw `auth:` config section (e.g. token auth in tests)
        self.binary = binary
        self.log_level = log_level
        self.start_timeout = start_timeout
        # SIGTERM the registry if the thread that started it dies (a test runner killed with
        # SIGKILL must not leak registries). Only for callers whose starting thread lives as
        # long as the registry should (main thread of pytest or the CLI).
        self.die_with_parent = die_with_parent
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.root / "registry.log"

    def __enter__(self) -> "RegistryServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "version": 0.1,
            "log": {"level": self.log_level, "accesslog": {"disabled": True}, "formatter": "text"},
            "storage": {
                "filesystem": {"rootdirectory": str(self.root / "data")},
                "delete": {"enabled": True},
                "maintenance": {"uploadpurging": {"enabled": False}},
            },
            "http": {
                "addr": f"{self.host}:{self.port}",
                "secret": secrets.token_hex(16),
                "headers": {"X-Content-Type-Options": ["nosniff"]},
            },
        }
        if self.htpasswd is not None:
            path = self.root / "htpasswd"
            path.write_text("".join(f"{u}:{_bcrypt(p, self.htpasswd_cost)}\n" for u, p in self.htpasswd.items()))
            cfg["auth"] = {"htpasswd": {"realm": "rollstack", "path": str(path)}}
        elif self.auth is not None:
            cfg["auth"] = self.auth
        return cfg

    def start(self) -> "RegistryServer":
        if self.process is not None:
            return self
        if not os.access(self.binary, os.X_OK):
            raise RegistryUnavailable(f"{self.binary} not found (install the docker-registry package)")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InvalidRequest(f"cannot use {self.root} as registry root: {exc.strerror}") from None
        pick_port = self.port == 0
        for _ in range(5 if pick_port else 1):
            if pick_port:
                _port_free(self.host, 0)  # InvalidRequest for a host we cannot bind
                self.port = free_port(self.host)
            elif not _port_free(self.host, self.port):
                # something else (e.g. the distro's own registry service) answers there
                raise RegistryUnavailable(f"address {self.host}:{self.port} is already in use")
            if self._spawn_and_wait():
                return self
        raise RegistryUnavailable(f"docker-registry did not start on {self.host}:{self.port}: {self._log_tail()}",
                                  log=str(self.log_path))

    def _spawn_and_wait(self) -> bool:
        config_path = self.root / "config.yml"
        config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        with open(self.log_path, "ab") as log:
            argv = [self.binary, "serve", str(config_path)]
            if self.die_with_parent and os.access(SETPRIV, os.X_OK):
                argv = [SETPRIV, "--pdeathsig", "TERM", "--", *argv]
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in a terminal reaches us, we stop it cleanly
            )
        deadline = time.monotonic() + self.start_timeout
        with httpx.Client(timeout=1.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    self.process = None
                    return False
                try:
                    if client.get(f"{self.url}/v2/").status_code in (200, 401):
                        return True
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        self.stop()
        return False

    def stop(self, timeout: float = 5.0) -> None:
        proc, self.process = self.process, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def kill(self) -> None:
        """SIGKILL without cleanup (tests: a registry that dies under its clients)."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def wait(self) -> int:
        """Blocks until the registry exits (foreground `rollstack registry serve`). Polls rather
        than blocking in `Popen.wait`: a Ctrl-C that lands inside `wait` can leave the Popen's
        internal waitpid lock held, and the `stop()` after it then waits on that lock forever
        (seen once in CI: `registry serve` did not exit 15 s after SIGINT)."""
        proc = self.process
        if proc is None:
            return 0
        while (code := proc.poll()) is None:
            time.sleep(0.1)
        return code

    def _log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:].strip()
        except OSError:
            return ""
