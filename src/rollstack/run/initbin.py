"""Locating the static binaries every environment bind-mounts (rollstack-execd or catatonit as
PID 1, tini-static, busybox), and rollstack's own host helpers.

rollstack-execd and rollstack-treecp are built from native/ by `make setup` (native/build.sh);
each is looked for at its variable ($ROLLSTACK_EXECD, $ROLLSTACK_TREECP), then the checkout's
native/build/, then /usr/local/libexec/rollstack/ (`find_native`). Without rollstack-execd PID 1
is catatonit and every exec goes through `runc exec` (slower; a warning is logged); without
rollstack-treecp a fork copies with `cp -a` (slower, run/snapshot.py).

They run inside rootfs trees that may have no libc (a busybox test root, a distroless image),
so they must be statically linked: an ELF with no PT_INTERP program header.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
from pathlib import Path

from rollstack.errors import RuntimeFailure
from rollstack.run.ocispec import InitBinaries

log = logging.getLogger(__name__)

EXECD_NAME = "rollstack-execd"
INIT_CANDIDATES = ("/usr/bin/catatonit", "/usr/libexec/podman/catatonit")
WRAPPER_CANDIDATES = ("/usr/bin/tini-static", "/sbin/tini-static", "/usr/bin/tini")
SHELL_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")
_PT_INTERP = 3


def is_static_elf(path: str | Path) -> bool:
    """True for an ELF executable without an interpreter (statically linked)."""
    try:
        with open(path, "rb") as f:
            ident = f.read(64)
            if len(ident) < 64 or ident[:4] != b"\x7fELF":
                return False
            is64, little = ident[4] == 2, ident[5] == 1
            end = "<" if little else ">"
            if is64:
                phoff, = struct.unpack_from(end + "Q", ident, 32)
                phentsize, phnum = struct.unpack_from(end + "HH", ident, 54)
            else:
                phoff, = struct.unpack_from(end + "I", ident, 28)
                phentsize, phnum = struct.unpack_from(end + "HH", ident, 42)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
        for i in range(phnum):
            p_type, = struct.unpack_from(end + "I", table, i * phentsize)
            if p_type == _PT_INTERP:
                return False
        return True
    except (OSError, struct.error):
        return False


def _first_static(candidates: tuple[str, ...], name: str) -> str:
    found = [c for c in candidates if Path(c).is_file()]
    which = shutil.which(name)
    if which:
        found.append(which)
    for c in found:
        if is_static_elf(c):
            return c
    raise RuntimeFailure(f"no statically linked {name} found (looked at {', '.join(candidates)});"
                         f" install Debian's catatonit, tini and busybox-static packages")


def native_candidates(name: str) -> list[Path]:
    """Where rollstack's own binary `name` (rollstack-execd, rollstack-treecp) is looked for."""
    env = os.environ.get(name.upper().replace("-", "_"))  # ROLLSTACK_EXECD, ROLLSTACK_TREECP
    checkout = Path(__file__).resolve().parents[3] / "native" / "build" / name
    return [Path(p) for p in (env, checkout, f"/usr/local/libexec/rollstack/{name}") if p]


def find_native(name: str) -> str | None:
    """rollstack's own static binary `name`, or None if it was not built."""
    for c in native_candidates(name):
        if c.is_file() and is_static_elf(c):
            return str(c)
    return None


def execd_candidates() -> list[Path]:
    return native_candidates(EXECD_NAME)


def find_execd() -> str | None:
    """The static rollstack-execd binary, or None if it was not built."""
    return find_native(EXECD_NAME)


def find_init_binaries() -> InitBinaries:
    """PID 1 (rollstack-execd, else the host's static catatonit), tini (runc exec's wrapper) and
    busybox (runc exec's fd shuffling)."""
    wrapper = _first_static(WRAPPER_CANDIDATES, "tini-static")
    shell = _first_static(SHELL_CANDIDATES, "busybox")
    execd = find_execd()
    if execd is not None:
        return InitBinaries(init=execd, exec_wrapper=wrapper, shell=shell, init_args=(), agent=True)
    log.warning("%s not found (looked at %s; `make setup` builds it): PID 1 is catatonit and "
                "every exec is a runc exec", EXECD_NAME, ", ".join(map(str, execd_candidates())))
    return InitBinaries(init=_first_static(INIT_CANDIDATES, "catatonit"), exec_wrapper=wrapper,
                        shell=shell)
