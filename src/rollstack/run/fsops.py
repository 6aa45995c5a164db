"""Directory operations inside an environment's root, with `SafeRoot`'s rules (rollstack.run.files).

`TreeRoot` adds what a sandbox filesystem API needs beyond read/write/list: facts about an entry
without following a final symlink (`entry`), a recursive listing to a depth (`walk`), `make_dir`,
`move` and `remove`. Parents are resolved from a directory fd of the root component by
component (`SafeRoot._walk`: `..` refused, absolute symlinks refused, relative ones followed
only while they stay inside); the final component is then acted on by name relative to its
parent's fd (`mkdirat`, `renameat`, `unlinkat`, fd-based `rmtree`), so it is never followed: a
symlink is removed or moved itself, never what it points to.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat as statmod

from rollstack.errors import AlreadyExists, InvalidRequest, NotFound, UnsafePath
from rollstack.contract.files import Entry
from rollstack.run.files import SafeRoot, split_request
from rollstack.run.lowerview import kind_of

MAX_WALK_ENTRIES = 100_000
"""A listing stops with InvalidRequest past this many entries."""


def _norm(parts: list[str]) -> str:
    return "/" + "/".join(parts)


class TreeRoot(SafeRoot):
    """`SafeRoot` plus entry facts, recursive listing, mkdir, move and remove."""

    def _parent(self, parts: list[str], create: bool = False) -> list[int]:
        """Dir fds from the root to the parent of `parts[-1]` (the caller closes them)."""
        stack, last = self._walk(parts[:-1], create_dirs=create)
        if last is not None:
            try:
                stack.append(self._open_dir(stack[-1], last, create, self.id_base if create else 0))
            except BaseException:
                for fd in stack:
                    os.close(fd)
                raise
        return stack

    @staticmethod
    def _close(stack: list[int]) -> None:
        for fd in stack:
            os.close(fd)

    @staticmethod
    def _lstat(dir_fd: int, name: str, path: str) -> os.stat_result:
        try:
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            raise NotFound(f"no such file or directory: {path}") from None
        except NotADirectoryError:
            raise NotFound(f"no such file or directory: {path}") from None

    def _ids(self, st: os.stat_result) -> tuple[int, int]:
        """Owners as seen inside (a user-namespaced root's host ids minus its base)."""
        if not self.id_base:
            return st.st_uid, st.st_gid
        return tuple(i - self.id_base if self.id_base <= i < self.id_base + 65536 else 65534
                     for i in (st.st_uid, st.st_gid))  # type: ignore[return-value]

    def _entry(self, dir_fd: int, name: str, path: str, st: os.stat_result) -> Entry:
        target = os.readlink(name, dir_fd=dir_fd) if statmod.S_ISLNK(st.st_mode) else None
        return Entry(name, path, kind_of(st.st_mode), st.st_size, st.st_mode, *self._ids(st),
                     st.st_mtime, target)

    def entry(self, path: str) -> Entry:
        """Facts about `path` itself (a final symlink is reported, not followed)."""
        parts = split_request(path)
        if not parts:
            st = os.stat(self.root)
            return Entry("/", "/", "dir", st.st_size, st.st_mode, *self._ids(st), st.st_mtime)
        stack = self._parent(parts)
        try:
            return self._entry(stack[-1], parts[-1], _norm(parts), self._lstat(stack[-1], parts[-1], path))
        finally:
            self._close(stack)

    def walk(self, path: str, depth: int = 1) -> list[Entry]:
        """The entries under directory `path`, `depth` levels deep (1: its children), sorted by
        path; symlinked directories are listed, not entered."""
        if depth < 1:
            raise InvalidRequest("depth must be at least 1")
        parts = split_request(path)
        stack, last = self._walk(parts)  # the directory itself may be reached through symlinks
        try:
            if last is not None:
                stack.append(self._open_dir(stack[-1], last, False))
            out: list[Entry] = []
            self._walk_into(stack[-1], _norm(parts).rstrip("/"), depth, out)
            return sorted(out, key=lambda e: e.path)
        except InvalidRequest as exc:
            if "not a directory" in exc.message:
                raise InvalidRequest(f"not a directory: {path}") from None
            raise
        finally:
            self._close(stack)

    def _walk_into(self, dir_fd: int, prefix: str, depth: int, out: list[Entry]) -> None:
        for name in sorted(os.listdir(dir_fd)):
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if len(out) >= MAX_WALK_ENTRIES:
                raise InvalidRequest(f"more than {MAX_WALK_ENTRIES} entries; list a smaller tree")
            out.append(self._entry(dir_fd, name, f"{prefix}/{name}", st))
            if depth > 1 and statmod.S_ISDIR(st.st_mode):
                try:
                    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
                except OSError:
                    continue  # replaced meanwhile: skip rather than follow
                try:
                    self._walk_into(sub, f"{prefix}/{name}", depth - 1, out)
                finally:
                    os.close(sub)

    def make_dir(self, path: str, mode: int = 0o755) -> Entry:
        """Create directory `path` and missing parents; AlreadyExists if something is there."""
        parts = split_request(path)
        if not parts:
            raise AlreadyExists("/ exists")
        stack = self._parent(parts, create=True)
        try:
            try:
                os.mkdir(parts[-1], mode, dir_fd=stack[-1])
            except FileExistsError:
                raise AlreadyExists(f"{_norm(parts)} exists") from None
            if self.id_base:
                os.chown(parts[-1], self.id_base, self.id_base, dir_fd=stack[-1], follow_symlinks=False)
            st = self._lstat(stack[-1], parts[-1], path)
            return self._entry(stack[-1], parts[-1], _norm(parts), st)
        finally:
            self._close(stack)

    def move(self, source: str, destination: str) -> Entry:
        """Rename `source` (itself, even a symlink) to `destination`, creating missing parents of
        the destination; an existing destination file is replaced."""
        src, dst = split_request(source), split_request(destination)
        if not src or not dst:
            raise InvalidRequest("cannot move the root directory")
        if dst[:len(src)] == src:
            raise InvalidRequest(f"cannot move {_norm(src)} into itself")
        s_stack = self._parent(src)
        try:
            self._lstat(s_stack[-1], src[-1], source)
            d_stack = self._parent(dst, create=True)
            try:
                try:
                    os.rename(src[-1], dst[-1], src_dir_fd=s_stack[-1], dst_dir_fd=d_stack[-1])
                except OSError as e:
                    if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.EISDIR, errno.ENOTDIR, errno.EINVAL):
                        raise InvalidRequest(f"cannot move {source} to {destination}: {e.strerror}") from None
                    raise
                st = self._lstat(d_stack[-1], dst[-1], destination)
                return self._entry(d_stack[-1], dst[-1], _norm(dst), st)
            finally:
                self._close(d_stack)
        finally:
            self._close(s_stack)

    def set_attrs(self, path: str, uid: int | None = None, gid: int | None = None,
                  mode: int | None = None) -> Entry:
        """chown/chmod `path` itself (ids as seen inside; permission bits only). A symlink is
        refused: it is acted on through an O_PATH descriptor of the entry, never followed."""
        parts = split_request(path)
        if mode is not None and not 0 <= mode <= 0o7777:
            raise InvalidRequest(f"mode must be permission bits (0..0o7777), not {mode!r}")
        for what, v in (("uid", uid), ("gid", gid)):
            if v is not None and not 0 <= v < 65536:
                raise InvalidRequest(f"{what} must be 0..65535, not {v!r}")
        if not parts:
            raise InvalidRequest("the root directory's attributes are not changed")
        stack = self._parent(parts)
        try:
            dir_fd, name = stack[-1], parts[-1]
            try:
                fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            except FileNotFoundError:
                raise NotFound(f"no such file or directory: {path}") from None
            try:
                st = os.fstat(fd)
                if statmod.S_ISLNK(st.st_mode):
                    raise InvalidRequest(f"{_norm(parts)} is a symlink: its attributes are not changed")
                proc = f"/proc/self/fd/{fd}"
                if uid is not None or gid is not None:
                    os.chown(proc, -1 if uid is None else uid + self.id_base, -1 if gid is None else gid + self.id_base)
                if mode is not None:
                    os.chmod(proc, mode)
                st = os.fstat(fd)
            finally:
                os.close(fd)
            return self._entry(dir_fd, name, _norm(parts), st)
        finally:
            self._close(stack)

    def remove(self, path: str) -> None:
        """Remove `path` itself: a file or symlink is unlinked, a directory removed with all it
        holds (without following any symlink inside)."""
        parts = split_request(path)
        if not parts:
            raise UnsafePath("refusing to remove the root directory")
        stack = self._parent(parts)
        try:
            st = self._lstat(stack[-1], parts[-1], path)
            if statmod.S_ISDIR(st.st_mode):
                shutil.rmtree(parts[-1], dir_fd=stack[-1])
            else:
                os.unlink(parts[-1], dir_fd=stack[-1])
        finally:
            self._close(stack)
