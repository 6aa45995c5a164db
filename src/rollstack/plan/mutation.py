"""Applying a task mutation (a git-style unified diff) to a directory tree, all or nothing.

At runtime `root` is an environment's merged overlay mount, so every write lands in its private
upper layer. Paths in the diff are relative to `workdir` (absolute inside `root`).

Two phases, so nothing is ever half-applied: (1) parse the diff and compute every new file's
content in memory, reading old contents through an in-memory view that already reflects the
earlier patches of the same diff; any failure raises before the tree is touched; (2) write each
new file to a temporary name next to its destination and rename it into place, then remove the
deleted files. Safety: a path with `..`, an absolute path, or a path whose directories are
symlinks that climb out of `root` raises UnsafePath. Symlinks are resolved as inside a chroot at
`root` (absolute targets start at `root`); the last component of a path is never followed.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from rollstack.errors import MutationFailed, UnsafePath
from rollstack.plan.apply import new_content
from rollstack.plan.patch import FilePatch, parse_patch

MAX_SYMLINKS = 40
_GIT_SYMLINK = 0o120000
_GIT_SUBMODULE = 0o160000


@dataclass(frozen=True, slots=True)
class MutationResult:
    files_changed: int
    duration: float  # seconds, parse + apply + write
    paths: tuple[str, ...] = ()  # workdir-relative paths created, changed or removed


@dataclass(slots=True)
class _File:
    content: bytes
    mode: int  # permission bits
    symlink: bool = False
    owner: tuple[int, int] | None = None  # (uid, gid) to keep; None: like the parent directory


def _check_relative(path: str) -> list[str]:
    if not path or "\0" in path:
        raise UnsafePath(f"patch path {path!r} is empty or contains NUL")
    if path.startswith("/"):
        raise UnsafePath(f"patch path {path!r} is absolute")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts or not parts:
        raise UnsafePath(f"patch path {path!r} leaves the working directory")
    return parts


class _Tree:
    """The tree under `root` seen through the changes computed so far (phase 1 state)."""

    def __init__(self, root: Path, workdir: str) -> None:
        self.root = root
        self.base = [p for p in workdir.split("/") if p not in ("", ".")]
        if ".." in self.base:
            raise UnsafePath(f"workdir {workdir!r} contains '..'")
        self.changes: dict[str, _File | None] = {}  # workdir-relative path -> new state

    def host_path(self, rel: str) -> Path:
        """Where `rel` lives on the host: its directories resolved inside root, the last not followed."""
        parts = self.base + _check_relative(rel)
        parents = self._resolve(parts[:-1], rel)
        return self.root.joinpath(*parents, parts[-1])

    def _resolve(self, parts: list[str], rel: str) -> list[str]:
        todo = list(reversed(parts))
        done: list[str] = []
        links = 0
        while todo:
            name = todo.pop()
            if name in ("", "."):
                continue
            if name == "..":
                if not done:
                    raise UnsafePath(f"patch path {rel!r} goes through a symlink that leaves the root")
                done.pop()
                continue
            host = self.root.joinpath(*done, name)
            try:
                st = os.lstat(host)
            except FileNotFoundError:
                done.append(name)  # created on write
                continue
            except NotADirectoryError:
                raise MutationFailed(f"{rel}: a parent directory is not a directory", path=rel) from None
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > MAX_SYMLINKS:
                    raise UnsafePath(f"patch path {rel!r}: too many levels of symbolic links")
                target = os.readlink(host)
                if target.startswith("/"):
                    done = []
                todo.extend(reversed(target.split("/")))
                continue
            done.append(name)
        return done

    def read(self, rel: str) -> _File | None:
        if rel in self.changes:
            return self.changes[rel]
        host = self.host_path(rel)
        try:
            st = os.lstat(host)
        except (FileNotFoundError, NotADirectoryError):
            return None
        owner = (st.st_uid, st.st_gid)
        if stat.S_ISLNK(st.st_mode):
            return _File(os.readlink(host).encode("utf-8", "surrogateescape"), 0o777, True, owner)
        if not stat.S_ISREG(st.st_mode):
            raise MutationFailed(f"{rel}: not a regular file", path=rel)
        return _File(host.read_bytes(), stat.S_IMODE(st.st_mode), False, owner)


def _file_mode(git_mode: int | None, fallback: int) -> tuple[int, bool]:
    if git_mode is None:
        return fallback, False
    kind = git_mode & 0o170000
    if kind == _GIT_SYMLINK:
        return 0o777, True
    if kind == _GIT_SUBMODULE:
        raise MutationFailed("submodule changes cannot be applied")
    return (0o755 if git_mode & 0o111 else 0o644), False


def _plan_one(tree: _Tree, patch: FilePatch) -> None:
    path = patch.path
    if patch.is_new:
        if tree.read(path) is not None:
            raise MutationFailed(f"{path}: already exists in the working directory", path=path)
        mode, symlink = _file_mode(patch.new_mode, 0o644)
        tree.changes[path] = _File(new_content(b"", patch), mode, symlink)
        return
    source = patch.old_path
    assert source is not None
    old = tree.read(source)
    if old is None:
        raise MutationFailed(f"{source}: does not exist in the working directory", path=source)
    if patch.old_mode is not None and (patch.old_mode & 0o170000) == _GIT_SYMLINK and not old.symlink:
        raise MutationFailed(f"{source}: the patch expects a symlink", path=source)
    data = new_content(old.content, patch)
    if patch.is_delete:
        tree.changes[source] = None
        return
    target = patch.new_path
    assert target is not None
    if target != source and tree.read(target) is not None:
        raise MutationFailed(f"{target}: already exists in the working directory", path=target)
    mode, symlink = _file_mode(patch.new_mode, old.mode)
    if patch.new_mode is None:
        symlink = old.symlink
    if patch.rename:
        tree.changes[source] = None
    tree.changes[target] = _File(data, mode, symlink, old.owner)


def plan_changes(root: Path, diff: str | bytes, workdir: str = "/") -> tuple[_Tree, int]:
    """Phase 1: every new file state, computed in memory; touches nothing."""
    patches = parse_patch(diff)
    if not patches:
        text = diff.strip() if isinstance(diff, (str, bytes)) else diff
        if text:
            raise MutationFailed("no valid patches in the mutation")
    tree = _Tree(root, workdir)
    for patch in patches:
        for name in (patch.old_path, patch.new_path):
            if name is not None:
                _check_relative(name)
        _plan_one(tree, patch)
    return tree, len(patches)


def _makedirs(host: Path, created: list[Path]) -> None:
    """Create the missing parents of `host`, remembering them (removed again if the write fails)."""
    missing = []
    parent = host.parent
    while not parent.is_dir():
        missing.append(parent)
        parent = parent.parent
    st = os.stat(parent)
    for d in reversed(missing):
        d.mkdir()
        created.append(d)
        _chown(d, (st.st_uid, st.st_gid))  # new directories belong to whoever owns the one above


def _remove_empty_parents(directory: Path, stop: Path) -> None:
    """Like git: a deletion that empties a directory removes it (up to the workdir)."""
    while directory != stop and stop in directory.parents:
        try:
            directory.rmdir()
        except OSError:
            return
        directory = directory.parent


def _write(tree: _Tree, rel: str, new: _File, created: list[Path]) -> tuple[Path, Path]:
    host = tree.host_path(rel)
    _makedirs(host, created)
    tmp = host.with_name(f".{host.name}.rollstack-{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)  # a leftover of a crashed run; O_EXCL below refuses anything planted
    owner = new.owner
    if owner is None:  # a new file belongs to whoever owns its directory (the agent's user, say)
        st = os.stat(host.parent)
        owner = (st.st_uid, st.st_gid)
    try:
        if new.symlink:
            os.symlink(new.content.decode("utf-8", "surrogateescape"), tmp)
            _chown(tmp, owner)
        else:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                view = memoryview(new.content)
                while view:
                    view = view[os.write(fd, view):]
                _chown(fd, owner)
                os.fchmod(fd, new.mode)  # after chown, which clears setuid/setgid bits
            finally:
                os.close(fd)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp, host


def _chown(target: int | Path, owner: tuple[int, int]) -> None:
    if (os.geteuid(), os.getegid()) == owner:
        return
    try:
        if isinstance(target, int):
            os.fchown(target, *owner)
        else:
            os.lchown(target, *owner)
    except PermissionError:
        pass  # not root: the file stays ours, as with git apply


@dataclass(frozen=True)
class MutationPlan:
    """A mutation's new file states, computed once against one tree (`plan_mutation`), to be
    written into any tree with the same content under `workdir` (`write_mutation`): the N
    environments of one GRPO group stack the same lowers under N fresh uppers, so one plan
    serves them all. Paths are re-resolved, and checked, inside each root it is written to."""

    workdir: str
    changes: tuple[tuple[str, "_File | None"], ...]  # workdir-relative path -> new state (None: removed)
    files_changed: int


def plan_mutation(root: Path, diff: str | bytes, *, workdir: str = "/") -> MutationPlan:
    """Phase 1 only: parse `diff` and compute every new file state from `root`'s content."""
    tree, count = plan_changes(Path(root), diff, workdir)
    return MutationPlan(workdir, tuple(tree.changes.items()), count)


def apply_mutation(root: Path, diff: str | bytes, *, workdir: str = "/") -> MutationResult:
    """Apply `diff` under `root`/`workdir` exactly, or raise (MutationFailed, UnsafePath) untouched."""
    start = time.perf_counter()
    plan = plan_mutation(root, diff, workdir=workdir)
    write_mutation(root, plan)
    return MutationResult(plan.files_changed, time.perf_counter() - start, tuple(p for p, _ in plan.changes))


def write_mutation(root: Path, plan: MutationPlan) -> None:
    """Phase 2: write a plan's file states under `root`/`plan.workdir`, all or nothing (raises
    MutationFailed, UnsafePath before the tree is changed)."""
    tree = _Tree(Path(root), plan.workdir)
    tree.changes = dict(plan.changes)
    staged: list[tuple[Path, Path]] = []
    created: list[Path] = []
    try:
        for rel, new in tree.changes.items():
            if new is not None:
                staged.append(_write(tree, rel, new, created))
    except BaseException as exc:  # an OSError, or UnsafePath from this root's symlinks
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        for d in reversed(created):
            try:
                d.rmdir()
            except OSError:
                pass
        if isinstance(exc, OSError):
            raise MutationFailed(f"cannot write the mutation: {exc}") from None
        raise
    # renames and unlinks only from here on: nothing left that is likely to fail halfway
    for rel, new in tree.changes.items():
        if new is None:
            host = tree.host_path(rel)
            host.unlink(missing_ok=True)
            _remove_empty_parents(host.parent, tree.root.joinpath(*tree.base))
    for tmp, host in staged:
        os.replace(tmp, host)
