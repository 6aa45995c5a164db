"""The C library, loaded once through ctypes, with the prototypes of the calls the node makes
itself: mount(2), umount2(2), syncfs(2), setns(2), prctl(2) and syscall(2) (the new mount API, open_tree,
mount_setattr), and glibc's malloc_trim(3). Each caller turns an errno into its own error."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.syscall.restype = ctypes.c_long
libc.syncfs.argtypes = [ctypes.c_int]
libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_malloc_trim = getattr(libc, "malloc_trim", None)  # glibc only
if _malloc_trim is not None:
    _malloc_trim.argtypes = [ctypes.c_size_t]

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_BIND = 1, 2, 4, 4096
"""mount(2) flags the node passes (<sys/mount.h>)."""
MNT_DETACH = 2
"""umount2(2): detach the mount now, free it once no longer busy."""
CLONE_NEWNET = 0x40000000
"""setns(2): the namespace is a network namespace (<sched.h>)."""


def mount(source: bytes | None, target: str | os.PathLike[str], fstype: bytes | None,
          flags: int = 0, data: bytes | None = None) -> int:
    """One mount(2) call: 0, or the errno it failed with."""
    if libc.mount(source, os.fsencode(target), fstype, flags, data) == 0:
        return 0
    return ctypes.get_errno()


def umount2(target: str | os.PathLike[str], flags: int = 0) -> int:
    """One umount2(2) call on `target` as given: 0, or the errno it failed with."""
    if libc.umount2(os.fsencode(target), flags) == 0:
        return 0
    return ctypes.get_errno()


def syncfs(path: str | os.PathLike[str]) -> None:
    """syncfs(2): write back the dirty data of the filesystem holding `path`; OSError on failure."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    finally:
        os.close(fd)


def setns(fd: int, nstype: int) -> int:
    """setns(2) of the calling thread into the namespace open at `fd`: 0, or the errno."""
    if libc.setns(fd, nstype) == 0:
        return 0
    return ctypes.get_errno()


def syscall(nr: int, *args: object) -> int:
    """A raw syscall(2); OSError with the errno when it returns < 0."""
    res = libc.syscall(ctypes.c_long(nr), *args)
    if res < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(res)


def malloc_trim() -> bool:
    """glibc's malloc_trim(0): give the memory freed in every malloc arena back to the kernel
    (not only the top of the heap). A long-running process whose threads allocate in many arenas
    keeps what they freed otherwise (measured: docs/benchmarks.md, "The node agent's memory").
    False where the C library has no such call (musl)."""
    return _malloc_trim is not None and bool(_malloc_trim(0))


PR_SET_PDEATHSIG = 1
"""prctl(2): the signal this process gets when the thread that forked it ends."""
SPAWNER_ENV = "ROLLSTACK_SPAWNER"
"""The pid of the node process that spawned a helper (`spawner_env`), for `die_with_spawner`."""


def spawner_env() -> dict[str, str]:
    """The environment for a helper process the node spawns and that must not outlive it."""
    return {**os.environ, SPAWNER_ENV: str(os.getpid())}


def die_with_spawner() -> None:
    """First thing in a node's helper process (a layer extraction, an EROFS build): SIGKILL when
    the thread that spawned it ends (PR_SET_PDEATHSIG; SIGKILL also ends a helper a fork holds
    stopped, host.foreground), and exit now if the spawner named in `SPAWNER_ENV` is already gone.
    Without the variable (run by hand) nothing changes."""
    spawner = os.environ.get(SPAWNER_ENV, "")
    if not spawner.isdigit():
        return
    if libc.prctl(PR_SET_PDEATHSIG, 9) != 0:  # SIGKILL
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != int(spawner):  # the process, not the thread: a dead thread is signalled
        os._exit(1)  # the spawner died before the prctl: its child would never be told
