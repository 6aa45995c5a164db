"""The OCI runtime spec (runc's config.json) of one environment: pure, no I/O.

What an environment gets (see docs/runtime.md for the reasons):
- root: the merged overlay dir, writable; /tmp stays on it (so the files API sees it; the diff
  excludes it by default).
- PID 1: a static zombie-reaping init bind-mounted read-only from the host at /.rollstack/init
  (catatonit in pause mode `-P`: it runs no child, only reaps); commands run through
  /.rollstack/tini (tini-static as a subreaper) under /.rollstack/busybox sh, which reports the
  exit status (see `rollstack.run.runc`). All three are static, so any rootfs works.
- namespaces: mount, pid, ipc, uts, network, cgroup. The network namespace is new (loopback
  only) unless `netns_path` names one prepared by rollstack.run.network (veth + policy), which
  runc then joins.
- no_new_privileges; the container-engine default capability set (Docker/containerd's 14,
  below); runc's masked and read-only paths; runc's default devices.
- cgroup `linux.cgroupsPath = "/<parent>/<env-id>"` (default parent `rollstack`): with runc's
  cgroupfs driver that is `<mount>/rollstack/<env-id>` under every v1 controller, or
  `/sys/fs/cgroup/rollstack/<env-id>` on v2. Resources: CPU quota from cores, memory limit with
  swap left to the host (none here; see _resources), pids limit (default 4096: stops fork bombs).
- seccomp: allow by default, deny a short list of kernel-surface syscalls and the creation of
  user namespaces (`seccomp_profile`).
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from rollstack.errors import InvalidRequest
from rollstack.host.cgroups import CGROUP_PARENT

INIT_DIR = "/.rollstack"
INIT_PATH = f"{INIT_DIR}/init"
EXEC_WRAPPER_PATH = f"{INIT_DIR}/tini"
SHELL_PATH = f"{INIT_DIR}/busybox"

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Docker/containerd's default set: what runc runs with under the engines people know. `runc
# spec`'s own 3-capability example set breaks ordinary root work (chown, apt's setuid sandbox).
DEFAULT_CAPABILITIES: tuple[str, ...] = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
    "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
)
RUNC_SPEC_CAPABILITIES: tuple[str, ...] = ("CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE")

MASKED_PATHS: tuple[str, ...] = (
    "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
    "/sys/firmware", "/sys/devices/virtual/powercap",
)
READONLY_PATHS: tuple[str, ...] = (
    "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
)

ENV_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # use .fullmatch
_ID_RE = ENV_ID_RE
_ENV_KEY_RE = re.compile(r"[^=\x00]+")
_HOSTNAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_CAP_RE = re.compile(r"CAP_[A-Z_]+")
MIN_MEMORY = 8 * 1024 * 1024  # below this runc/the kernel refuse or the init cannot start
MIN_CPU_QUOTA_US = 1000       # the kernel's minimum CFS quota


CPU_PERIOD_US = 100_000
"""The CFS period of a spec's CPU quota unless it sets its own (µs)."""


@dataclass(frozen=True)
class InitBinaries:
    """Host paths of the static binaries bind-mounted into every environment."""

    init: str = "/usr/bin/catatonit"
    """PID 1: reaps zombies. rollstack-execd (native/execd) also serves execs; catatonit is
    started as `init -P` (pause: no child)."""
    exec_wrapper: str = "/usr/bin/tini-static"
    """Wraps every exec as `tini -s -g -- argv` (subreaper: the exec's whole tree stays below it)."""
    shell: str = "/bin/busybox"
    """Static busybox: its `sh` reports each exec's exit status on an extra fd (see runc.py)."""
    init_args: tuple[str, ...] = ("-P",)
    """Arguments of PID 1 after its path."""
    agent: bool = False
    """PID 1 is rollstack-execd: it serves execs on a socket passed as its fd 3 (run/agent.py)."""


@dataclass(frozen=True)
class SpecParams:
    """Everything that varies between environments' specs."""

    env_id: str
    """Container id and cgroup leaf name: [A-Za-z0-9][A-Za-z0-9_.-]{0,127}."""
    hostname: str = "rollstack"
    cwd: str = "/"
    """Default working directory of commands (absolute)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment variables on top of PATH/HOME defaults."""
    cpu: float | None = None
    """CPU quota in cores (None: unlimited)."""
    memory: int | None = None
    """Memory limit in bytes (None: unlimited). Swap is not limited separately."""
    pids_limit: int | None = 4096
    """Maximum tasks in the environment (None: unlimited; do not, fork bombs)."""
    nofile: int = 65536
    """RLIMIT_NOFILE soft and hard."""
    cpu_period_us: int = CPU_PERIOD_US
    cgroup_parent: str = CGROUP_PARENT
    capabilities: tuple[str, ...] = DEFAULT_CAPABILITIES
    init: InitBinaries = field(default_factory=InitBinaries)
    shm_bytes: int = 64 * 1024 * 1024
    oom_score_adj: int = 500
    """Makes the host's OOM killer pick environments before the agent (cgroup OOMs are local)."""
    seccomp: bool = True
    """Apply `seccomp_profile()`: a deny list of kernel-attack-surface syscalls."""
    arch: str = field(default_factory=platform.machine)
    """Host architecture (`uname -m`), for the seccomp profile's architectures."""
    netns_path: str | None = None
    """Join this network namespace (made by rollstack.run.network) instead of a fresh one."""
    userns_map: tuple[int, int] | None = None
    """(host id, count): run in a new user namespace mapping 0.. to these host uids/gids."""
    volumes: tuple[tuple[str, str, bool], ...] = ()
    """(host dir, mount point, read-only): bind mounts of node volumes (rollstack.node.volumes)."""


# Denied with EPERM: kernel surfaces an agent's workload never needs (keys, bpf, perf, module and
# kexec loading, mounts, handles, clock/swap/reboot, accounting). Most also need capabilities
# we do not grant; the list is defence in depth, like Docker's default profile but shorter.
SECCOMP_DENIED: tuple[str, ...] = (
    "add_key", "keyctl", "request_key", "bpf", "perf_event_open", "userfaultfd",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "open_by_handle_at", "name_to_handle_at", "mount", "umount2", "pivot_root", "setns",
    "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
    "acct", "swapon", "swapoff", "reboot", "settimeofday", "clock_settime", "clock_adjtime",
    "adjtimex", "syslog", "quotactl", "lookup_dcookie", "iopl", "ioperm", "vhangup",
)
CLONE_NEWUSER = 0x10000000
_SECCOMP_ARCHES = {
    "x86_64": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
    "aarch64": ["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"],
}


def seccomp_profile(arch: str) -> dict[str, Any]:
    """Allow by default; deny SECCOMP_DENIED, and new user namespaces (the one namespace an
    unprivileged process may create, and a large kernel surface): clone/unshare with
    CLONE_NEWUSER get EPERM; clone3 gets ENOSYS so libc falls back to clone (its flags live in
    memory seccomp cannot read)."""
    newuser = [{"index": 0, "value": CLONE_NEWUSER, "valueTwo": CLONE_NEWUSER,
                "op": "SCMP_CMP_MASKED_EQ"}]
    profile: dict[str, Any] = {
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [
            {"names": list(SECCOMP_DENIED), "action": "SCMP_ACT_ERRNO", "errnoRet": 1},
            {"names": ["unshare"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1, "args": newuser},
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38},
        ],
    }
    # clone's flags are argument 0 on x86_64 and arm64 alike (s390 differs: not supported here)
    profile["syscalls"].append({"names": ["clone"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1,
                                "args": newuser})
    if arch in _SECCOMP_ARCHES:
        profile["architectures"] = _SECCOMP_ARCHES[arch]
    return profile


def cgroup_path(env_id: str, parent: str = CGROUP_PARENT) -> str:
    """The spec's `linux.cgroupsPath` for an environment (absolute, cgroupfs driver)."""
    return f"/{parent.strip('/')}/{env_id}"


def cpu_quota(cores: float, period_us: int = CPU_PERIOD_US) -> int:
    """CFS quota in microseconds per `period_us` for `cores` CPUs (at least the kernel minimum)."""
    return max(MIN_CPU_QUOTA_US, int(round(cores * period_us)))


def _validate(rootfs: str, p: SpecParams) -> None:
    if not _ID_RE.fullmatch(p.env_id):
        raise InvalidRequest(f"invalid environment id {p.env_id!r}")
    if not rootfs.startswith("/") or "\x00" in rootfs:
        raise InvalidRequest(f"rootfs must be an absolute path: {rootfs!r}")
    if not _HOSTNAME_RE.fullmatch(p.hostname):
        raise InvalidRequest(f"invalid hostname {p.hostname!r}")
    if not p.cwd.startswith("/") or "\x00" in p.cwd:
        raise InvalidRequest(f"cwd must be an absolute path: {p.cwd!r}")
    for k, v in p.env.items():
        if not isinstance(k, str) or not isinstance(v, str) or not _ENV_KEY_RE.fullmatch(k) \
                or "\x00" in v:
            raise InvalidRequest(f"invalid environment variable {k!r}")
    if p.cpu is not None and not (p.cpu > 0 and p.cpu < 1e6):
        raise InvalidRequest(f"cpu must be a positive number of cores, not {p.cpu!r}")
    if p.memory is not None and p.memory < MIN_MEMORY:
        raise InvalidRequest(f"memory must be at least {MIN_MEMORY} bytes, not {p.memory!r}")
    if p.pids_limit is not None and p.pids_limit < 8:
        raise InvalidRequest(f"pids_limit must be at least 8, not {p.pids_limit!r}")
    if not 1000 <= p.cpu_period_us <= 1_000_000:
        raise InvalidRequest(f"cpu period must be 1000..1000000 us, not {p.cpu_period_us}")
    if p.nofile < 64:
        raise InvalidRequest(f"nofile must be at least 64, not {p.nofile}")
    parent = p.cgroup_parent.strip("/")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*", parent) \
            or any(c in (".", "..") for c in parent.split("/")):
        raise InvalidRequest(f"invalid cgroup parent {p.cgroup_parent!r}")
    for cap in p.capabilities:
        if not _CAP_RE.fullmatch(cap):
            raise InvalidRequest(f"invalid capability {cap!r}")
    if p.netns_path is not None and (not p.netns_path.startswith("/") or "\x00" in p.netns_path):
        raise InvalidRequest(f"netns path must be absolute: {p.netns_path!r}")
    if p.userns_map is not None and not (p.userns_map[0] > 0 and 0 < p.userns_map[1] <= 1 << 24):
        raise InvalidRequest(f"invalid user namespace mapping {p.userns_map!r}")
    for source, target, _ro in p.volumes:
        if not source.startswith("/") or not target.startswith("/") or "\x00" in source + target:
            raise InvalidRequest(f"volume mount {source!r} -> {target!r}: both paths must be absolute")


def _env_list(extra: Mapping[str, str]) -> list[str]:
    env = {"PATH": DEFAULT_PATH, "HOME": "/root"}
    env.update(extra)
    return [f"{k}={v}" for k, v in env.items()]


def _mounts(p: SpecParams) -> list[dict[str, Any]]:
    ro_bind = ["bind", "ro", "nosuid", "nodev"]
    return [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", f"size={p.shm_bytes}"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs",
         "options": ["nosuid", "noexec", "nodev", "ro"]},
        {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
         "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]},
        {"destination": INIT_PATH, "type": "bind", "source": p.init.init, "options": ro_bind},
        {"destination": EXEC_WRAPPER_PATH, "type": "bind", "source": p.init.exec_wrapper,
         "options": ro_bind},
        {"destination": SHELL_PATH, "type": "bind", "source": p.init.shell, "options": ro_bind},
        *({"destination": target, "type": "bind", "source": source,
           "options": ["rbind", "nosuid", "nodev", "ro" if ro else "rw"]} for source, target, ro in p.volumes),
    ]


def quota_resources(cpu: float | None, memory: int | None, period_us: int = CPU_PERIOD_US) -> dict[str, Any]:
    """The spec's `linux.resources` entries for a CPU quota in cores and a memory limit in bytes
    (None: unlimited, no entry). Pure."""
    res: dict[str, Any] = {}
    if cpu is not None:
        res["cpu"] = {"quota": cpu_quota(cpu, period_us), "period": period_us}
    if memory is not None:
        # No "swap": on v1 memory+swap (memsw) must stay >= the memory limit, so a pinned memsw
        # would make every later raise of memory.limit_in_bytes (the provisioner's) fail EINVAL.
        res["memory"] = {"limit": int(memory)}
    return res


def _resources(p: SpecParams) -> dict[str, Any]:
    res: dict[str, Any] = {"devices": [{"allow": False, "access": "rwm"}],
                           **quota_resources(p.cpu, p.memory, p.cpu_period_us)}
    if p.pids_limit is not None:
        res["pids"] = {"limit": int(p.pids_limit)}
    return res


def _namespaces(p: SpecParams) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount", "cgroup")]
    if p.netns_path is not None:
        out[1] = {"type": "network", "path": p.netns_path}
    if p.userns_map is not None:
        out.append({"type": "user"})
    return out


def _id_mappings(p: SpecParams) -> dict[str, Any]:
    if p.userns_map is None:
        return {}
    m = [{"containerID": 0, "hostID": int(p.userns_map[0]), "size": int(p.userns_map[1])}]
    return {"uidMappings": m, "gidMappings": [dict(x) for x in m]}


def build_spec(rootfs: str, params: SpecParams) -> dict[str, Any]:
    """The config.json document for runc. Raises InvalidRequest on bad parameters."""
    _validate(rootfs, params)
    caps = list(dict.fromkeys(params.capabilities))
    return {
        "ociVersion": "1.0.2-dev",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": [INIT_PATH, *params.init.init_args],
            "env": _env_list(params.env),
            "cwd": params.cwd,
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": params.nofile,
                         "soft": params.nofile}],
            "noNewPrivileges": True,
            "oomScoreAdj": params.oom_score_adj,
        },
        "root": {"path": rootfs, "readonly": False},
        "hostname": params.hostname,
        "mounts": _mounts(params),
        "annotations": {"org.rollstack.env-id": params.env_id},
        "linux": {
            "cgroupsPath": cgroup_path(params.env_id, params.cgroup_parent),
            "resources": _resources(params),
            "namespaces": _namespaces(params),
            **_id_mappings(params),
            "maskedPaths": list(MASKED_PATHS),
            "readonlyPaths": list(READONLY_PATHS),
            **({"seccomp": seccomp_profile(params.arch)} if params.seccomp else {}),
        },
    }
