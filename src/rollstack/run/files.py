"""Reading and writing files inside an environment's root without ever leaving it.

The root is the merged overlay dir on the host, and a command inside the environment can plant
anything there (symlinks to /etc/passwd, symlink loops, ...). Every path is therefore resolved
here component by component from a directory fd of the root, each step `openat(O_NOFOLLOW)`
(`os.open(name, ..., dir_fd=parent)`), never by handing the kernel a whole path. The rules:

- A request path is read as absolute inside the root (`etc/x` == `/etc/x`). A `..` component in
  the request is refused (UnsafePath); `.` and repeated slashes are ignored.
- Relative symlinks met during resolution are followed, component by component, as long as
  they stay inside the root; one whose `..` would climb above the root is refused.
- Absolute symlinks are refused (UnsafePath): we do not reinterpret them against the root,
  because the same link would mean a host path to any tool that is not this one.
- At most 40 symlinks per resolution (like the kernel's ELOOP limit), then UnsafePath.
- Only regular files are read or written; devices and fifos are never even opened (O_PATH +
  fstat + reopen through /proc/self/fd), since opening a device runs host driver code.

Directory fds are held while walking, so a concurrent rename inside the environment can at
worst make us act on a different path that is still inside the root.
"""

from __future__ import annotations

import errno
import os
import stat as statmod
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from rollstack.contract.files import split_request
from rollstack.errors import InvalidRequest, NotFound, UnsafePath
from rollstack.run.lowerview import kind_of

MAX_SYMLINKS = 40
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class FileInfo:
    """One entry as the files API reports it."""

    name: str
    type: str  # file | dir | symlink | other
    size: int
    mode: int  # permission bits
    mtime: float
    target: str | None = None  # symlink target


class SafeRoot:
    """File operations confined to `root` (see the module docstring for the rules)."""

    def __init__(self, root: Path, id_base: int = 0) -> None:
        self.root = Path(root)
        # a user-namespaced environment (run/userns.py): what we create is owned by its root
        # (host id_base), and owners are reported as seen inside (host id - id_base)
        self.id_base = id_base

    def _own(self, fd: int) -> None:
        if self.id_base:
            os.fchown(fd, self.id_base, self.id_base)

    # -- resolution --------------------------------------------------------------------------

    def _walk(self, parts: list[str], create_dirs: bool = False) -> tuple[list[int], str | None]:
        """Resolve all but the last component to open dir fds.

        Returns (stack of dir fds, root first; the last name, or None when the path names the
        directory on top of the stack). Symlinks are followed under the rules above, the last
        component's too. The caller closes the fds.
        """
        try:
            stack = [os.open(self.root, _DIR_FLAGS)]
        except OSError as e:
            raise NotFound(f"environment root is not a directory: {self.root}") from e
        todo = deque(parts)
        links = 0
        try:
            while todo:
                name = todo.popleft()
                if name == "..":  # only ever from a relative symlink's target
                    if len(stack) == 1:
                        raise UnsafePath("a symlink points above the environment's root")
                    os.close(stack.pop())
                    continue
                target = self._link_target(stack[-1], name)
                if target is not None:
                    links += 1
                    if links > MAX_SYMLINKS:
                        raise UnsafePath("too many levels of symbolic links")
                    todo.extendleft(reversed(_link_parts(target)))
                    continue
                if not todo:
                    return stack, name
                stack.append(self._open_dir(stack[-1], name, create_dirs, self.id_base))
            return stack, None
        except BaseException:
            for fd in stack:
                os.close(fd)
            raise

    @staticmethod
    def _open_dir(dir_fd: int, name: str, create: bool, owner: int = 0) -> int:
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            if not create:
                raise NotFound(f"no such directory: {name}") from None
        except NotADirectoryError:
            raise InvalidRequest(f"not a directory: {name}") from None
        except OSError as e:
            if e.errno == errno.ELOOP:  # became a symlink after we looked: refuse the race
                raise UnsafePath(f"{name} changed to a symlink during resolution") from None
            raise
        try:
            os.mkdir(name, 0o755, dir_fd=dir_fd)
            made = True
        except FileExistsError:
            made = False
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError as e:  # replaced right after mkdir: refuse rather than guess
            raise UnsafePath(f"{name} changed during resolution") from e
        if made and owner:
            try:
                os.fchown(fd, owner, owner)
            except BaseException:
                os.close(fd)  # not handed out yet: ours to close
                raise
        return fd

    @staticmethod
    def _link_target(dir_fd: int, name: str) -> str | None:
        """The target of `name` if it is a symlink (refusing absolute ones), else None."""
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if not statmod.S_ISLNK(st.st_mode):
            return None
        target = os.readlink(name, dir_fd=dir_fd)
        if target.startswith("/"):
            raise UnsafePath(f"refusing to follow absolute symlink {name} -> {target}")
        return target

    def _open_parent(self, path: str, create_dirs: bool = False) -> tuple[list[int], str | None]:
        return self._walk(split_request(path), create_dirs)

    # -- operations --------------------------------------------------------------------------

    def read_file(self, path: str, limit: int | None = None) -> bytes:
        """The bytes of a regular file (at most `limit` bytes if given)."""
        stack, last = self._open_parent(path)
        try:
            if last is None:
                raise InvalidRequest(f"is a directory: {path}")
            fd = self._open_regular(stack[-1], last, False, path)
            try:
                with os.fdopen(fd, "rb", closefd=False) as f:
                    return f.read() if limit is None else f.read(limit)
            finally:
                os.close(fd)
        finally:
            for d in stack:
                os.close(d)

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Create or replace a regular file, creating missing parent dirs (0755)."""
        stack, last = self._open_parent(path, create_dirs=True)
        try:
            if last is None:
                raise InvalidRequest(f"is a directory: {path}")
            fd = self._open_regular(stack[-1], last, True, path, mode)
            try:
                if self.id_base and os.fstat(fd).st_uid == 0:  # made by us just now
                    self._own(fd)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fchmod(fd, mode & 0o7777)
            finally:
                os.close(fd)
        finally:
            for d in stack:
                os.close(d)

    @staticmethod
    def _open_regular(dir_fd: int, name: str, write: bool, path: str, mode: int = 0o644) -> int:
        """Open `name` only if it is a regular file, without ever open()ing anything else.

        A command can plant device nodes or fifos (and swap names while we look), and a plain
        open() of a device runs its driver's open on the host. So: an O_PATH handle first
        (never reaches a driver), fstat it, then reopen that very inode via /proc/self/fd.
        A missing file is created with O_EXCL, which cannot land on anything else.
        """
        for _ in range(10):
            try:
                pfd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            except FileNotFoundError:
                if not write:
                    raise NotFound(f"no such file: {path}") from None
                try:
                    return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                   | os.O_CLOEXEC, mode, dir_fd=dir_fd)
                except FileExistsError:
                    continue  # appeared meanwhile: look again
            try:
                st = os.fstat(pfd)
                if statmod.S_ISLNK(st.st_mode):
                    raise UnsafePath(f"path changed to a symlink while opening: {path}")
                if statmod.S_ISDIR(st.st_mode):
                    raise InvalidRequest(f"is a directory: {path}")
                if not statmod.S_ISREG(st.st_mode):
                    raise InvalidRequest(f"not a regular file: {path}")
                flags = (os.O_WRONLY | os.O_TRUNC) if write else os.O_RDONLY
                return os.open(f"/proc/self/fd/{pfd}", flags | os.O_CLOEXEC)
            finally:
                os.close(pfd)
        raise UnsafePath(f"path keeps changing while opening: {path}")

    def stat(self, path: str) -> FileInfo:
        """Facts about one entry (a final symlink is resolved like in read_file)."""
        stack, last = self._open_parent(path)
        try:
            if last is None:
                st = os.fstat(stack[-1])
                return FileInfo(path.rstrip("/").rsplit("/", 1)[-1] or "/", "dir", st.st_size, statmod.S_IMODE(st.st_mode), st.st_mtime)
            try:
                st = os.stat(last, dir_fd=stack[-1], follow_symlinks=False)
            except FileNotFoundError:
                raise NotFound(f"no such file: {path}") from None
            return FileInfo(last, kind_of(st.st_mode), st.st_size, statmod.S_IMODE(st.st_mode),
                            st.st_mtime)
        finally:
            for d in stack:
                os.close(d)

    def makedirs(self, path: str) -> None:
        """Create a directory and its missing parents (0755), like `mkdir -p`."""
        stack, last = self._walk(split_request(path), create_dirs=True)
        try:
            if last is not None:
                stack.append(self._open_dir(stack[-1], last, True))
        finally:
            for d in stack:
                os.close(d)

    def copy_up_dirs(self, path: str) -> int:
        """Have an overlay copy the directories on `path` (root excluded) up into its upper now,
        by a no-op chown of each to its own owner (overlayfs copies a lower inode up on any
        setattr): a later write under `path` then makes no directory inodes. Best effort: stops
        at the first component that is missing or not a directory (no symlink is followed).
        Directories appear in a diff only through the files in them, so nothing shows. Returns
        the directories passed."""
        fd = os.open(self.root, _DIR_FLAGS)
        n = 0
        try:
            for name in split_request(path):
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not statmod.S_ISDIR(st.st_mode):
                    break
                os.chown(name, st.st_uid, st.st_gid, dir_fd=fd, follow_symlinks=False)
                nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)  # O_NOFOLLOW: not swapped for a link
                fd, prev = nxt, fd  # before the close: a failing close is not retried below
                os.close(prev)
                if statmod.S_IMODE(st.st_mode) & 0o6000:  # a chown may clear setgid
                    os.fchmod(fd, statmod.S_IMODE(st.st_mode))
                n += 1
        except (FileNotFoundError, NotADirectoryError):
            pass  # the rest of the path does not exist (yet): the handout makes it
        except OSError as e:
            if e.errno != errno.ELOOP:  # a component became a symlink: leave it to the handout
                raise
        finally:
            os.close(fd)
        return n

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
            return True
        except NotFound:
            return False

    def list_dir(self, path: str = "/") -> list[FileInfo]:
        """The entries of a directory, sorted by name (symlinks reported, not followed)."""
        stack, last = self._open_parent(path)
        try:
            if last is None:
                fd = os.dup(stack[-1])
            else:
                try:
                    fd = os.open(last, _DIR_FLAGS, dir_fd=stack[-1])
                except FileNotFoundError:
                    raise NotFound(f"no such directory: {path}") from None
                except OSError as e:
                    if e.errno in (errno.ENOTDIR, errno.ELOOP):
                        raise InvalidRequest(f"not a directory: {path}") from None
                    raise
            try:
                out = []
                for name in sorted(os.listdir(fd)):
                    try:
                        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    target = os.readlink(name, dir_fd=fd) if statmod.S_ISLNK(st.st_mode) \
                        else None
                    out.append(FileInfo(name, kind_of(st.st_mode), st.st_size,
                                        statmod.S_IMODE(st.st_mode), st.st_mtime, target))
                return out
            finally:
                os.close(fd)
        finally:
            for d in stack:
                os.close(d)


def _link_parts(target: str) -> list[str]:
    return [p for p in target.split("/") if p not in ("", ".")]
