"""The kernel-facing tools of rollstack.run.network: `ip -batch`, nftables transactions
(in-process through libnftables, else `nft -f`), sysctl writes, and the leak probe."""

from __future__ import annotations

import json
import re
import subprocess
import threading
from pathlib import Path
from typing import Sequence

from rollstack.errors import RuntimeFailure

PREFIX = "rsn"


def leftovers(slots: Sequence[int]) -> dict[str, list[str]]:
    """Which kernel objects of these slots still exist: interfaces, netns, nft tables."""
    out: dict[str, list[str]] = {"interfaces": [], "netns": [], "tables": [], "addresses": []}
    tables = set(_tables())
    addrs = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    for s in slots:
        if Path(f"/sys/class/net/{PREFIX}h{s}").exists():
            out["interfaces"].append(f"{PREFIX}h{s}")
        if Path(f"/run/netns/{PREFIX}-{s}").exists():
            out["netns"].append(f"{PREFIX}-{s}")
        if f"{PREFIX}_{s}" in tables:
            out["tables"].append(f"{PREFIX}_{s}")
        if f" {PREFIX}h{s} " in addrs:
            out["addresses"].append(f"{PREFIX}h{s}")
    return out


def _ip(commands: Sequence[str], netns: str | None = None) -> None:
    args = ["ip", *(["-n", netns] if netns else []), "-batch", "-"]
    _run(args, "\n".join(commands) + "\n", "ip")


class _Libnft:
    """libnftables in-process (Debian's libnftables1, which `nft` itself links): one netlink
    transaction per script without spawning a process (0.2-3 ms vs 5-50 ms for `nft -f` here)."""

    def __init__(self) -> None:
        import ctypes

        lib = ctypes.CDLL("libnftables.so.1", use_errno=True)
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
        lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
        self.lib, self.ctx = lib, lib.nft_ctx_new(0)
        if not self.ctx:
            raise OSError("nft_ctx_new failed")
        lib.nft_ctx_buffer_error(self.ctx)
        lib.nft_ctx_buffer_output(self.ctx)
        self.lock = threading.Lock()

    def run(self, script: str) -> None:
        with self.lock:  # a context is not thread-safe
            rc = self.lib.nft_run_cmd_from_buffer(self.ctx, script.encode())
            err = (self.lib.nft_ctx_get_error_buffer(self.ctx) or b"").decode(errors="replace")
        if rc != 0:
            raise RuntimeFailure(f"nft failed: {err.strip()[-800:]}", stderr=err)


_LIBNFT: list[_Libnft | None] = []


def _nft(script: str) -> None:
    """Load an nft script as one transaction: in-process when libnftables loads, else `nft -f`."""
    if not _LIBNFT:
        try:
            _LIBNFT.append(_Libnft())
        except OSError:
            _LIBNFT.append(None)
    lib = _LIBNFT[0]
    if lib is not None:
        lib.run(script)
    else:
        _run(["nft", "-f", "-"], script, "nft")


def _run(args: list[str], stdin: str, what: str) -> None:
    try:
        proc = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise RuntimeFailure(f"{what} is not installed (scripts/setup-system.sh installs it)") from None
    except subprocess.TimeoutExpired:
        raise RuntimeFailure(f"{what} timed out") from None
    if proc.returncode != 0:
        raise RuntimeFailure(f"{what} failed: {proc.stderr.strip()[-800:]}", stderr=proc.stderr)


def _tables() -> list[str]:
    proc = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True)
    return [line.split()[-1] for line in proc.stdout.splitlines() if line.startswith("table inet ")]


def _sysctl(key: str, value: str) -> None:
    try:
        Path("/proc/sys", key).write_text(value)
    except OSError as e:
        raise RuntimeFailure(f"sysctl {key.replace('/', '.')}={value}: {e.strerror}") from None


IFNAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}")
"""An interface name that is safe as a /proc/sys path component."""


def devices_of(routes_json: str) -> set[str]:
    """The output devices of `ip -j route get|show` text: host interfaces only (not `lo`, not
    the node's own veths), names checked (they become /proc/sys paths)."""
    try:
        routes = json.loads(routes_json or "[]")
    except ValueError:
        return set()
    out = set()
    for r in routes if isinstance(routes, list) else []:
        dev = r.get("dev") if isinstance(r, dict) else None
        if isinstance(dev, str) and dev != "lo" and not dev.startswith(PREFIX) and IFNAME.fullmatch(dev):
            out.add(dev)
    return out


def route_devices(destinations: Sequence[str]) -> set[str]:
    """The host interfaces the kernel routes each destination through (`"default"`: the default
    routes'; an address: `ip route get`). Unroutable destinations give nothing."""
    out: set[str] = set()
    for dest in destinations:
        args = ["ip", "-j", "route", "show", "default"] if dest == "default" else ["ip", "-j", "route", "get", dest]
        try:
            r = subprocess.run(args, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0:
            out |= devices_of(r.stdout)
    return out
