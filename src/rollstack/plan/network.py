"""The plan's network policy: `network:` and `expose:` (syntax only; names resolve on the node).

    network: none                          # default: loopback only
    network: outbound                      # NAT'd egress anywhere except the deny list, no ingress
    network: {allow: ["host:8000",         # the node itself, through the environment's gateway
                      "10.1.2.3:443",      # one address
                      "10.8.0.0/16:8000",  # a CIDR
                      "models.lan:30000"]} # a name, resolved once when the environment is created
    expose: [8080]                         # ports the client reaches through the node's API

Every entry is TCP/UDP to one port, or an address, CIDR or name without a port: all of its ports
(and protocols). Never reachable in any mode (`DENIED_NETS`): link-local
(cloud metadata, 169.254.0.0/16), loopback, multicast/reserved space; the node's other
environments and the node's own services are blocked by the node (rollstack.run.network).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

NODE_HOST = "host"
"""The allow-entry host naming the node itself (reached at the environment's gateway address)."""

DENIED_NETS: tuple[ipaddress.IPv4Network, ...] = tuple(ipaddress.IPv4Network(n) for n in (
    "169.254.0.0/16", "127.0.0.0/8", "0.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4",
))
_HOST_RE = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                      r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")


@dataclass(frozen=True)
class AllowEntry:
    """One parsed `network.allow` entry: exactly one of `net` (an address or CIDR), `name` (to
    resolve) or `node` (the node itself)."""

    text: str
    port: int | None
    """None: every port (an entry written without one)."""
    net: ipaddress.IPv4Network | None = None
    name: str | None = None
    node: bool = False


def parse_port(value: Any, what: str = "port") -> int:
    if isinstance(value, bool):
        raise ValueError(f"{what} {value!r} is not a port number")
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if not isinstance(value, int):
        raise ValueError(f"{what} {value!r} is not a port number")
    if not 1 <= value <= 65535:
        raise ValueError(f"{what} {value} is out of range (1-65535)")
    return value


def parse_allow(entry: Any) -> AllowEntry:
    """`HOST:PORT`, `ADDRESS:PORT` or `CIDR:PORT` -> AllowEntry; ValueError naming the problem."""
    if not isinstance(entry, str):
        raise ValueError(f"{entry!r} must be a string 'HOST:PORT' or 'CIDR:PORT'")
    text = entry.strip()
    if text.startswith("[") or text.count(":") > 1:
        raise ValueError(f"{entry!r}: IPv6 endpoints are not supported (environments are IPv4 only)")
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port = text, None  # every port of it
    elif not host:
        raise ValueError(f"{entry!r} must be 'HOST:PORT', 'CIDR:PORT', or an address/CIDR/name alone")
    else:
        port = parse_port(port_text, f"{entry!r}: port")
    if host == NODE_HOST:
        if port is None:
            raise ValueError(f"{entry!r}: the node is reached on one port ('host:PORT')")
        return AllowEntry(text, port, node=True)
    if re.fullmatch(r"[0-9./]+", host):
        try:
            net = ipaddress.IPv4Network(host, strict=False) if "/" in host \
                else ipaddress.IPv4Network(f"{ipaddress.IPv4Address(host)}/32")
        except ValueError as exc:
            raise ValueError(f"{entry!r}: {host!r} is not an IPv4 address or CIDR ({exc})") from None
        check_not_denied(net, entry)
        return AllowEntry(text, port, net=net)
    if not _HOST_RE.fullmatch(host) or host.lower() == "localhost":
        raise ValueError(f"{entry!r}: {host!r} is not a host name, address or CIDR"
                         + (" (the node's loopback is not reachable; use 'host:PORT')"
                            if host.lower() == "localhost" else ""))
    return AllowEntry(text, port, name=host.rstrip("."))


def check_not_denied(net: ipaddress.IPv4Network, entry: Any) -> None:
    """0.0.0.0/0 is fine (the node still drops the deny list); any other overlap is an error."""
    if net.prefixlen == 0:
        return
    for bad in DENIED_NETS:
        if net.overlaps(bad):
            hint = " (use 'host:PORT' for the node itself)" if bad.network_address.is_loopback else ""
            raise ValueError(f"{entry!r}: {net} overlaps {bad}, which is never reachable{hint}")


class AllowPolicy(BaseModel):
    """`network: {allow: [...]}`: egress only to these endpoints."""

    model_config = ConfigDict(extra="forbid")
    allow: list[str]

    @field_validator("allow")
    @classmethod
    def _allow(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("allow needs at least one endpoint (or use network: none)")
        for i, entry in enumerate(v):
            try:
                parse_allow(entry)
            except ValueError as exc:
                raise ValueError(f"allow[{i}]: {exc}") from None
        return v

    def entries(self) -> list[AllowEntry]:
        return [parse_allow(e) for e in self.allow]


NetworkField = Literal["none", "outbound"] | AllowPolicy


def check_network(v: Any) -> Any:
    """Before-validator of `Plan.network`: one clear message instead of pydantic's per-branch ones."""
    if isinstance(v, str) and v not in ("none", "outbound"):
        raise ValueError(f"{v!r} is not a network mode (none, outbound, or {{allow: [HOST:PORT, ...]}})")
    if isinstance(v, dict):
        unknown = sorted(set(v) - {"allow"})
        if unknown:
            raise ValueError(f"unknown field {unknown[0]!r} (a policy is {{allow: [HOST:PORT, ...]}})")
        allow = v.get("allow")
        if not isinstance(allow, list):
            raise ValueError("allow must be a list of 'HOST:PORT' / 'CIDR:PORT' entries")
        AllowPolicy._allow(allow)  # raises ValueError("allow[i]: ...")
        return AllowPolicy.model_construct(allow=list(allow))
    if not isinstance(v, (str, AllowPolicy)):
        raise ValueError(f"must be none, outbound or {{allow: [...]}}, not {type(v).__name__}")
    return v


def check_expose(v: Any) -> list[int]:
    if not isinstance(v, list):
        raise ValueError(f"must be a list of ports, not {type(v).__name__}")
    ports = [parse_port(p, f"expose[{i}]") for i, p in enumerate(v)]
    if len(set(ports)) != len(ports):
        raise ValueError("ports must not repeat")
    return ports


def network_mode(network: NetworkField) -> str:
    return network if isinstance(network, str) else "allow"
