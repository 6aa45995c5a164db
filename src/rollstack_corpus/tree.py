"""Build steps on directory trees: run a script in a chroot over an overlay, capture the diff.

A step stacks read-only lower trees under a writable upper directory with overlayfs, mounts
/proc, /dev and a tmpfs /tmp, and runs a shell script chrooted into the result. Everything the
script writes lands in the upper directory, which is then exactly the step's diff (overlay
whiteouts, 0/0 character devices, mark deletions). All mounts live in a private mount namespace
(`unshare --mount`), so they vanish with the step's process even if it is killed: nothing to
unmount by hand. With `network=False` the step also gets an empty network namespace.

Only the host's CA bundle and resolver are bind-mounted in (over files that must exist in the
tree); the chroot gets a clean environment with an explicit pip index so the host's pip
configuration (find-links, certificates) never leaks into the trees.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from rollstack.errors import RuntimeFailure

CHROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
HOST_RESOLV = Path("/etc/resolv.conf")


def default_env() -> dict[str, str]:
    """The environment inside build chroots (no host PIP_* or proxies beyond what is needed)."""
    return {
        "PATH": CHROOT_PATH,
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "DEBIAN_FRONTEND": "noninteractive",
        "PIP_INDEX_URL": "https://pypi.org/simple",
        "PIP_NO_CACHE_DIR": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_ROOT_USER_ACTION": "ignore",
        "PIP_DEFAULT_TIMEOUT": "120",
        "npm_config_update_notifier": "false",
        "npm_config_fund": "false",
        "npm_config_audit": "false",
    }


@dataclass
class ChrootStep:
    """One script run in a chroot of `lowers` (top first) with writes going to `upper`.

    `upper=None` runs directly in `lowers[0]` (which must then be the only lower): used to
    finish the OS base tree itself."""

    lowers: list[Path]
    upper: Path | None
    script: str
    network: bool = True
    env: dict[str, str] = field(default_factory=default_env)
    binds: list[tuple[Path, str]] = field(default_factory=list)
    """(host directory, absolute path under /tmp inside the root) made visible read-write."""
    ro_binds: list[tuple[Path, str]] = field(default_factory=list)
    """(host path, absolute path inside the root, which must exist in the tree) read-only."""
    timeout: float = 1800.0


@dataclass(frozen=True, slots=True)
class StepResult:
    returncode: int
    output: str


def run_step(step: ChrootStep, scratch: Path) -> StepResult:
    """Run `step`; returns its exit code and combined output (never raises on non-zero exit)."""
    if not step.lowers:
        raise ValueError("a step needs at least one lower tree")
    if step.upper is None and len(step.lowers) != 1:
        raise ValueError("a step without upper runs in exactly one tree")
    for b in step.binds:
        if not b[1].startswith("/tmp/"):
            raise ValueError("bind targets live under /tmp (a tmpfs inside the chroot)")
    scratch.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="step-", dir=scratch))
    try:
        root = tmp / "root"
        root.mkdir()
        work = None
        if step.upper is not None:
            step.upper.mkdir(parents=True, exist_ok=True)
            work = step.upper.parent / f".{step.upper.name}.work"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir()
        (tmp / "inner.sh").write_text("set -e\n" + step.script + "\n")
        (tmp / "outer.sh").write_text(_outer_script(step, root, work, tmp / "inner.sh"))
        cmd = ["unshare", "--mount", "--propagation", "private"]
        if not step.network:
            cmd.append("--net")
        cmd += ["--", "/bin/sh", str(tmp / "outer.sh")]
        return _run(cmd, step.timeout)
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


def _outer_script(step: ChrootStep, root: Path, work: Path | None, inner: Path) -> str:
    q = shlex.quote
    r = q(str(root))
    lines = ["set -e"]
    if step.upper is None:
        lines.append(f"mount --bind {q(str(step.lowers[0]))} {r}")
    else:
        lower = ":".join(str(p) for p in step.lowers)
        opts = f"lowerdir={lower},upperdir={step.upper},workdir={work}"
        lines.append(f"mount -t overlay overlay -o {q(opts)} {r}")
    lines += [
        f"mount -t proc proc {r}/proc",
        f"mount --rbind /dev {r}/dev",
        f"mount -t tmpfs -o mode=1777 tmpfs {r}/tmp",
        f"mkdir -p {r}/tmp/rs-step",
        f"cp {q(str(inner))} {r}/tmp/rs-step/inner.sh",
    ]
    if step.network:
        # Bind over files the tree already has, so nothing shows up in the diff.
        for host, inside in ((HOST_CA_BUNDLE, "etc/ssl/certs/ca-certificates.crt"), (HOST_RESOLV, "etc/resolv.conf")):
            lines.append(f"if [ -f {r}/{inside} ] && [ -f {q(str(host))} ]; then mount --bind {q(str(host))} {r}/{inside}; fi")
    for host, inside in step.binds:
        lines.append(f"mkdir -p {r}{q(inside)} && mount --bind {q(str(host))} {r}{q(inside)}")
    for host, inside in step.ro_binds:
        lines.append(f"mount --rbind {q(str(host))} {r}{q(inside)} && mount -o remount,bind,ro {r}{q(inside)}")
    if not step.network:
        lines.append("ip link set lo up 2>/dev/null || true")
    env = " ".join(q(f"{k}={v}") for k, v in step.env.items())
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"  # resolved on the host: env -i changes PATH
    lines.append(f"exec env -i {env} {chroot} {r} /bin/sh /tmp/rs-step/inner.sh")
    return "\n".join(lines) + "\n"


def _run(cmd: list[str], timeout: float) -> StepResult:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise RuntimeFailure(f"build step timed out after {timeout:.0f}s",
                             output=out.decode(errors="replace")[-4000:]) from None
    except BaseException:
        # Interrupted (Ctrl-C, a failing sibling thread): the step has its own session, end it too.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        raise
    return StepResult(proc.returncode, out.decode(errors="replace"))


def check_step(step: ChrootStep, scratch: Path, what: str) -> str:
    """run_step, raising RuntimeFailure with the output's tail when the script fails."""
    res = run_step(step, scratch)
    if res.returncode != 0:
        raise RuntimeFailure(f"{what} failed (exit {res.returncode}):\n{res.output[-3000:]}")
    return res.output


@dataclass(frozen=True, slots=True)
class TreeStats:
    bytes: int
    files: int
    whiteouts: int


def tree_stats(root: Path) -> TreeStats:
    """Apparent bytes (each inode once), non-directory entries and overlay whiteouts under root."""
    total = files = whiteouts = 0
    seen: set[tuple[int, int]] = set()
    stack = [str(root)]
    while stack:
        with os.scandir(stack.pop()) as it:
            for e in it:
                st = e.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    stack.append(e.path)
                    continue
                files += 1
                if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                    whiteouts += 1
                    continue
                key = (st.st_dev, st.st_ino)
                if key in seen:
                    continue
                seen.add(key)
                total += st.st_size
    return TreeStats(total, files, whiteouts)


def copy_tree(src: Path, dst: Path) -> None:
    """Copy a tree preserving everything (reflinks where the filesystem offers them)."""
    if dst.exists():
        remove_tree(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", "--reflink=auto", str(src), str(dst)], check=True)


def remove_tree(path: Path) -> None:
    """rm -rf that also handles read-only directories left by package builds."""
    if path.exists() or path.is_symlink():
        subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=True)
