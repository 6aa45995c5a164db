"""Per-environment network namespaces: a veth to the node, policy in an nftables table of its own.

Why veth + nftables (measured, docs/runtime.md "Security"): setup is two `ip` processes and one
nftables transaction (in-process through libnftables), a 100 MB download through the policy runs
near the link's speed; `pasta` needs a process per environment and ~25 ms just to spawn.

Size (~430 lines): one concept, a network slot's whole life: the plan's spec resolved, the
policy rendered (`ruleset`, pure), the slot pool, setup, uplinks, teardown; the host commands
and leftovers scan are `run.nettools`.

An environment with `network: none` and no `expose` gets nothing from here: runc makes it a
fresh netns holding only `lo` (as before). Anything else gets, for slot N of the node's pool
(default 10.213.0.0/16, one /30 per environment):

    netns  rsn-N   (/run/netns/rsn-N, joined by runc through the spec's namespace path)
      lo up; eth0 = 10.213.x.(4N+2)/30, default route via the gateway
    host   rsnhN   = the gateway 10.213.x.(4N+1)/30, forwarding on for this interface only
    nft    table inet rsn_N (host side; the environment has no CAP_NET_ADMIN there, or anywhere)
      from the env: source must be its own address (no spoofing with CAP_NET_RAW); then replies
        of established flows; then DENY (link-local/metadata, loopback, multicast, the whole
        pool = other environments) dropped; then the policy (allow: each endpoint's
        address/CIDR and port, tcp and udp; outbound: anything); then drop. This holds for packets
        to the node itself (input hook: the node API, other services) and beyond it (forward).
      to the env: only replies are forwarded (no ingress); the node itself may connect (that is
        how `expose` is served).
      outbound/allow: masquerade out of any other interface.

Slots are claimed with O_EXCL files under `state_dir` (shared by every runtime on the host), so
concurrent nodes never pick the same names or addresses. `teardown` removes the table, the
veth (both ends, synchronously), the netns and the claim, tolerating any of them being gone.

Forwarding past the node (`outbound`, or allow entries that are not the node itself) also needs
the uplink's forwarding on (replies are forwarded from it): the node turns it on for the
interfaces the kernel routes the destinations through (`ip route get`; outbound: the default
routes'), or only for those named in its config (`forward_interfaces`, `node start --uplink`);
see docs/runtime.md.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import secrets
import socket
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from rollstack.errors import NotFound, PlanInvalid, RuntimeFailure
from rollstack.plan.network import DENIED_NETS, AllowEntry
from rollstack.run.nettools import PREFIX, _ip, _nft, _sysctl, leftovers, route_devices

__all__ = ["NetHandle", "NetworkManager", "NetworkSpec", "Rule", "leftovers", "resolve_spec",
           "ruleset"]

log = logging.getLogger(__name__)

DEFAULT_POOL = "10.213.0.0/16"
DEFAULT_STATE_DIR = Path("/run/rollstack-net")
GATEWAY_REF = "${ROLLSTACK_GATEWAY}"


@dataclass(frozen=True)
class Rule:
    """One resolved allow endpoint: a network (or the node's gateway) and a port."""

    port: int | None
    """None: every port and protocol of `net`."""
    net: str | None = None
    """CIDR; None means the node itself (the environment's gateway address)."""


@dataclass(frozen=True)
class NetworkSpec:
    """What one environment's network must be (resolved: no names left)."""

    mode: str = "none"
    """none | allow | outbound"""
    rules: tuple[Rule, ...] = ()
    expose: tuple[int, ...] = ()
    endpoints: tuple[str, ...] = ()
    """Per allow entry, ADDRESS:PORT for the harness (a name: its first address; the node:
    `${ROLLSTACK_GATEWAY}:PORT`, substituted once a slot is claimed; a CIDR: CIDR:PORT)."""
    hosts: tuple[tuple[str, str], ...] = ()
    """(address, name) of every allowed name, as resolved at create: written to the
    environment's /etc/hosts (`add_hosts`), so the harness can use the name; no DNS server is
    reachable in `allow` mode."""

    @property
    def needs_netns(self) -> bool:
        return self.mode != "none" or bool(self.expose)


@dataclass(frozen=True)
class NetHandle:
    """What `setup` made (stored in the environment's meta.json; `teardown` takes it back)."""

    slot: int
    netns: str
    host_if: str
    gateway: str
    address: str
    state_dir: str

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.netns}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "NetHandle":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


def resolve_spec(mode: str, entries: Sequence[AllowEntry], expose: Sequence[int],
                 reserved_node_ports: Sequence[int] = ()) -> NetworkSpec:
    """Names -> addresses (once, now); PlanInvalid naming `network.allow[i]` on failure."""
    rules: list[Rule] = []
    eps: list[str] = []
    hosts: list[tuple[str, str]] = []
    for i, e in enumerate(entries):
        where = f"network.allow[{i}]"
        if e.node:
            if e.port in reserved_node_ports:
                raise PlanInvalid(f"{where}: {e.text!r}: port {e.port} is the node agent's own "
                                  "service, which environments can never reach")
            rules.append(Rule(e.port))
            eps.append(f"{GATEWAY_REF}:{e.port}")
        elif e.net is not None:
            rules.append(Rule(e.port, str(e.net)))
            eps.append(_endpoint(str(e.net.network_address if e.net.prefixlen == 32 else e.net), e.port))
        else:
            try:
                infos = socket.getaddrinfo(e.name, e.port, socket.AF_INET, socket.SOCK_STREAM)
            except (socket.gaierror, UnicodeError) as exc:
                raise PlanInvalid(f"{where}: cannot resolve {e.name!r}: {exc}") from None
            addrs = sorted({info[4][0] for info in infos})
            for a in addrs:
                net = ipaddress.IPv4Network(f"{a}/32")
                if any(net.overlaps(d) for d in DENIED_NETS):
                    raise PlanInvalid(f"{where}: {e.name!r} resolves to {a}, which is never reachable")
                rules.append(Rule(e.port, str(net)))
                if (a, e.name) not in hosts:
                    hosts.append((a, e.name))
            eps.append(_endpoint(addrs[0], e.port))
    return NetworkSpec(mode=mode, rules=tuple(rules), expose=tuple(expose), endpoints=tuple(eps),
                       hosts=tuple(hosts))


def _endpoint(address: str, port: int | None) -> str:
    return address if port is None else f"{address}:{port}"


HOSTS_MARK = "# rollstack: allowed names, resolved at create (network.allow)"


def add_hosts(files: Any, spec: NetworkSpec, replace: bool = False) -> None:
    """Write the allowed names to /etc/hosts through `files` (a SafeRoot on the rootfs): appended
    as a marked block, or with `replace`, in place of the block an earlier policy wrote (a name
    re-resolved must not keep its old address ahead of the new one)."""
    if not spec.hosts and not replace:
        return
    try:
        old = files.read_file("/etc/hosts").decode()
    except NotFound:
        old = "127.0.0.1\tlocalhost\n"
    if replace and HOSTS_MARK in old:
        head, _, block = old.partition(HOSTS_MARK)
        rest = block.split("\n")[1:]  # the block: the marker's line and the name lines after it
        while rest and "\t" in rest[0] and not rest[0].startswith("#"):
            rest.pop(0)
        old = head + "\n".join(rest)
    lines = [HOSTS_MARK, *(f"{a}\t{n}" for a, n in spec.hosts)] if spec.hosts else []
    body = old if old.endswith("\n") or not old else old + "\n"
    files.write_file("/etc/hosts", (body + ("\n".join(lines) + "\n" if lines else "")).encode())


def ruleset(h: NetHandle, spec: NetworkSpec, pool: str) -> str:
    """The nft script of one environment's table (pure; `nft -f` input)."""
    t, ifn = f"{PREFIX}_{h.slot}", h.host_if
    deny = ", ".join([*(str(n) for n in DENIED_NETS), pool])

    def accept(dst: str, port: int | None) -> str:
        if port is None:
            return f"ip daddr {dst} accept"
        return f"ip daddr {dst} meta l4proto {{ tcp, udp }} th dport {port} accept"

    node_rules = [accept(h.gateway, r.port) for r in spec.rules if r.net is None] \
        if spec.mode == "allow" else []
    net_rules = [accept(r.net, r.port) for r in spec.rules if r.net is not None] \
        if spec.mode == "allow" else []
    # To the node's own addresses only what names a port: a network allowed whole (no port)
    # must not open every service of a node whose address it contains
    node_net_rules = [accept(r.net, r.port) for r in spec.rules if r.net is not None and r.port is not None] \
        if spec.mode == "allow" else []
    lines = [
        f"table inet {t} {{",
        "  chain from_env {",
        f"    ip saddr != {h.address} drop",
        "    meta nfproto ipv6 drop",
        "    ct state established,related accept",
        "  }",
        "  chain to_node {",  # packets for an address of the node itself
        *(f"    {r}" for r in node_rules),
        f"    ip daddr {{ {deny} }} drop",
        *(f"    {r}" for r in node_net_rules),
        "    drop",
        "  }",
        "  chain beyond {",  # packets the node would forward
        f"    ip daddr {{ {deny} }} drop",
        *(["    accept"] if spec.mode == "outbound" else [f"    {r}" for r in net_rules]),
        "    drop",
        "  }",
        "  chain input {",
        "    type filter hook input priority -5; policy accept;",
        f'    iifname "{ifn}" jump from_env',
        f'    iifname "{ifn}" jump to_node',
        "  }",
        "  chain forward {",
        "    type filter hook forward priority -5; policy accept;",
        f'    iifname "{ifn}" jump from_env',
        f'    iifname "{ifn}" jump beyond',
        f'    oifname "{ifn}" ct state established,related accept',
        f'    oifname "{ifn}" drop',
        "  }",
    ]
    if spec.mode in ("outbound", "allow"):
        lines += [
            "  chain postrouting {",
            "    type nat hook postrouting priority 100; policy accept;",
            f'    ip saddr {h.address} oifname != "{ifn}" masquerade',
            "  }",
        ]
    lines.append("}")
    return "\n".join(lines) + "\n"


@dataclass
class NetworkManager:
    """Claims slots, builds and removes environments' namespaces, veths and tables."""

    pool: str = DEFAULT_POOL
    state_dir: Path = DEFAULT_STATE_DIR
    forward_interfaces: tuple[str, ...] = ()
    """Host interfaces (uplinks) whose forwarding is switched on when an egress env is made."""
    _net: ipaddress.IPv4Network = field(init=False, repr=False)
    _warm: list[NetHandle] = field(default_factory=list, init=False, repr=False)
    _prepared: set[int] = field(default_factory=set, init=False, repr=False)
    _pool_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _pool_stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _pool_wake: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _pool_thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _pool_owner: str = field(default="", init=False, repr=False)
    _pool_size: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        self._net = ipaddress.IPv4Network(self.pool)
        if self._net.prefixlen > 28:
            raise RuntimeFailure(f"network pool {self.pool} is too small (need /28 or larger)")
        for name in self.forward_interfaces:  # they become /proc/sys paths: interface names only
            if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}", name):
                raise RuntimeFailure(f"network uplink {name!r} is not an interface name")
        self.state_dir = Path(self.state_dir)

    @property
    def slots(self) -> int:
        return self._net.num_addresses // 4

    def _slot_file(self, slot: int) -> Path:
        return self.state_dir / "slots" / str(slot)

    def claim(self, owner: str) -> NetHandle:
        """An unused slot, claimed for `owner` (O_EXCL file: safe across processes)."""
        d = self.state_dir / "slots"
        d.mkdir(parents=True, exist_ok=True)
        start = secrets.randbelow(self.slots)
        for k in range(self.slots):
            slot = (start + k) % self.slots
            try:
                fd = os.open(self._slot_file(slot), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps({"owner": owner, "pid": os.getpid()}))
            base = self._net.network_address + 4 * slot
            return NetHandle(slot=slot, netns=f"{PREFIX}-{slot}", host_if=f"{PREFIX}h{slot}",
                             gateway=str(base + 1), address=str(base + 2),
                             state_dir=str(self.state_dir))
        raise RuntimeFailure(f"network pool {self.pool} is exhausted ({self.slots} environments)")

    # -- warm pool -----------------------------------------------------------------------------

    def start_pool(self, owner_prefix: str, size: int, lazy: bool = True) -> None:
        """Keep `size` slots prepared ahead (netns, veth, addresses, a drop-everything table) on
        a background thread, so a create only claims one and loads its policy (one nftables
        transaction). `lazy`: the thread starts at the first `acquire` (a node whose plans never
        ask for a network builds nothing)."""
        if size <= 0 or self._pool_thread is not None:
            return
        self._pool_owner, self._pool_size = f"{owner_prefix}warm", size
        if not lazy:
            self._start_filling()

    def _start_filling(self) -> None:
        with self._pool_lock:
            if self._pool_thread is not None or self._pool_size <= 0:
                return
            self._pool_stop.clear()
            self._pool_thread = threading.Thread(target=self._fill_loop, name="netns-pool", daemon=True)
            self._pool_thread.start()

    def stop_pool(self) -> None:
        """Stop refilling (for good) and remove every prepared, unclaimed slot."""
        with self._pool_lock:
            self._pool_size = 0
        self._pool_stop.set()
        self._pool_wake.set()
        if self._pool_thread is not None:
            self._pool_thread.join()
            self._pool_thread = None
        with self._pool_lock:
            warm, self._warm = self._warm, []
        for h in warm:
            self.teardown(h)

    def _fill_loop(self) -> None:
        # Refills must not compete with the create that just took a slot: this thread (and the
        # `ip` processes it spawns, which inherit it) runs at nice 10, a moment after the wake.
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except OSError:
            pass
        while not self._pool_stop.is_set():
            with self._pool_lock:
                short = len(self._warm) < self._pool_size
            if short:
                try:
                    h = self.claim(self._pool_owner)
                    self._prepare(h)
                except Exception:  # noqa: BLE001 - creates fall back to building inline
                    log.exception("preparing a warm network slot failed")
                    self._pool_stop.wait(1.0)
                    continue
                with self._pool_lock:
                    self._warm.append(h)
                continue
            if self._pool_wake.wait(1.0):
                self._pool_stop.wait(0.1)
            self._pool_wake.clear()

    def acquire(self, owner: str) -> NetHandle:
        """A slot for `owner`: a prepared one from the pool when there is one, else a new claim."""
        self._start_filling()
        with self._pool_lock:
            h = self._warm.pop() if self._warm else None
        if h is None:
            return self.claim(owner)
        self._pool_wake.set()
        self._slot_file(h.slot).write_text(json.dumps({"owner": owner, "pid": os.getpid(), "warm": True}))
        with self._pool_lock:
            self._prepared.add(h.slot)
        return h

    # -- build / remove ---------------------------------------------------------------------------

    def _prepare(self, h: NetHandle, attach_pid: int | None = None) -> None:
        """netns + veth + addresses + a table that drops everything from the environment.
        `attach_pid`: use that process's netns (a container's, made inside its user namespace)
        instead of a new one."""
        try:
            _ip([f"netns attach {h.netns} {attach_pid}" if attach_pid else "netns add " + h.netns,
                 f"link add {h.host_if} type veth peer name eth0 netns {h.netns}",
                 f"addr add {h.gateway}/30 dev {h.host_if}",
                 f"link set {h.host_if} up"])
            _ip([f"addr add {h.address}/30 dev eth0", "link set eth0 up", "link set lo up",
                 f"route add default via {h.gateway}"], netns=h.netns)
            _sysctl(f"net/ipv6/conf/{h.host_if}/disable_ipv6", "1")
            # Per-interface forwarding; what is forwarded is the table's business (none: nothing).
            _sysctl(f"net/ipv4/conf/{h.host_if}/forwarding", "1")
            _nft(ruleset(h, NetworkSpec("none"), self.pool))
        except BaseException:
            try:
                self.teardown(h)
            except Exception:  # noqa: BLE001 - the setup error is the one to report
                pass
            raise

    def uplinks(self, spec: NetworkSpec) -> list[str]:
        """The host interfaces whose forwarding `spec`'s egress needs: `forward_interfaces` when
        configured, else those the kernel routes its destinations through (outbound: the
        default routes'; allow: each allowed network's first address), found at each setup."""
        if self.forward_interfaces:
            return list(self.forward_interfaces)
        if spec.mode == "outbound":
            dests = ["default"]
        else:
            dests = [str(ipaddress.ip_network(r.net, strict=False).network_address) for r in spec.rules if r.net]
        return sorted(route_devices(dests))

    def setup(self, h: NetHandle, spec: NetworkSpec, attach_pid: int | None = None) -> None:
        """Build (or, for a slot from the pool, only re-policy) the netns, veth and table of
        claimed slot `h` (in the netns of `attach_pid` if given). On failure, undoes it and raises."""
        with self._pool_lock:
            prepared = h.slot in self._prepared
            self._prepared.discard(h.slot)
        if not prepared:
            self._prepare(h, attach_pid)
        try:
            self.apply(h, spec)
        except BaseException:
            try:
                self.teardown(h)
            except Exception:  # noqa: BLE001
                pass
            raise

    def apply(self, h: NetHandle, spec: NetworkSpec) -> None:
        """Load `spec` as slot `h`'s policy: its uplinks' forwarding on, then one nftables
        transaction replacing the table (no packet ever sees half of either policy)."""
        if spec.mode != "none":
            for uplink in self.uplinks(spec):
                _sysctl(f"net/ipv4/conf/{uplink}/forwarding", "1")
        _nft(f"delete table inet {PREFIX}_{h.slot}\n" + ruleset(h, spec, self.pool))

    def teardown(self, h: NetHandle) -> None:
        """Remove the table, veth, netns and claim of `h`; anything already gone is fine."""
        errors: list[str] = []
        table = f"{PREFIX}_{h.slot}"
        try:  # declaring it first makes the delete idempotent, in one process
            _nft(f"table inet {table} {{}}\ndelete table inet {table}\n")
        except RuntimeFailure as e:
            errors.append(str(e))
        cmds = ([f"link del {h.host_if}"] if Path(f"/sys/class/net/{h.host_if}").exists() else []) \
            + ([f"netns del {h.netns}"] if Path(h.netns_path).exists() else [])
        if cmds:
            try:
                _ip(cmds)
            except RuntimeFailure as e:
                errors.append(str(e))
        if errors:
            raise RuntimeFailure(f"network teardown of slot {h.slot} incomplete: {'; '.join(errors)}",
                                 errors=errors)
        Path(h.state_dir, "slots", str(h.slot)).unlink(missing_ok=True)

    def reclaim(self, owner_prefix: str, keep: Sequence[int] = ()) -> list[int]:
        """Tear down slots claimed under `owner_prefix` (a crashed run's, its warm pool's) except
        `keep`; returns them."""
        gone = []
        for slot in self.owned(owner_prefix):
            if slot in keep:
                continue
            base = self._net.network_address + 4 * slot
            self.teardown(NetHandle(slot, f"{PREFIX}-{slot}", f"{PREFIX}h{slot}", str(base + 1),
                                    str(base + 2), str(self.state_dir)))
            gone.append(slot)
        return gone

    def owned(self, owner_prefix: str = "") -> list[int]:
        """Claimed slots whose owner starts with `owner_prefix` (for leak checks and recovery)."""
        out = []
        for p in (self.state_dir / "slots").glob("*"):
            try:
                doc = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            if str(doc.get("owner", "")).startswith(owner_prefix):
                out.append(int(p.name))
        return sorted(out)
