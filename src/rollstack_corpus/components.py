"""Builders for each corpus component: OS base, repository, harness, evaluator trees.

Each builder produces one directory. The OS tree is a full root filesystem (debootstrap);
every other tree is a DIFF over it, captured as the upper directory of an overlay step (see
rollstack_corpus.tree), so groups stack: os + repo-X + harness-Y (+ evaluator) is a complete environment.
Builders raise RuntimeFailure with the failing step's output tail.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

from rollstack_corpus import runner as corpus_runner
from rollstack_corpus.spec import DEBIAN_MIRROR, SUITE, HarnessSpec, RepoSpec
from rollstack_corpus.tree import ChrootStep, check_step, remove_tree
from rollstack.errors import RuntimeFailure
from rollstack.tasks.plans import EVAL_DIR

_GIT = "git -c user.name=rollstack -c user.email=corpus@rollstack.invalid -c init.defaultBranch=main"


def build_os(dest: Path, packages: tuple[str, ...], debs_cache: Path, scratch: Path) -> None:
    """Debian minbase + `packages` at dest (removed first), apt caches emptied."""
    remove_tree(dest)
    debs_cache.mkdir(parents=True, exist_ok=True)
    cmd = [
        "debootstrap", "--variant=minbase", f"--cache-dir={debs_cache}",
        f"--include={','.join(packages)}", SUITE, str(dest), DEBIAN_MIRROR,
    ]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise RuntimeFailure(f"debootstrap failed:\n{proc.stdout.decode(errors='replace')[-3000:]}")
    # Lists and .debs are download caches, not part of an environment; /work holds repositories.
    script = "apt-get clean\nrm -rf /var/lib/apt/lists/*\nmkdir -p /work\ntouch /etc/resolv.conf"
    check_step(ChrootStep([dest], None, script, network=False), scratch, "OS finishing")


def build_repo(os_tree: Path, dest: Path, repo: RepoSpec, scratch: Path) -> None:
    """The repository's sdist at its workdir (a git checkout), its test deps in system site."""
    remove_tree(dest)
    wd = shlex.quote(repo.workdir)
    deps = " ".join(shlex.quote(d) for d in repo.test_deps)
    script = f"""
mkdir -p /tmp/sdist /tmp/src
pip download --no-deps --no-binary {shlex.quote(repo.name)} {shlex.quote(f"{repo.name}=={repo.version}")} -d /tmp/sdist
tar xzf /tmp/sdist/*.tar.gz -C /tmp/src --no-same-owner
mkdir -p /work
mv /tmp/src/* {wd}
cd {wd}
for t in {" ".join(shlex.quote(t) for t in repo.tests)}; do test -f "$t" || {{ echo "sdist lacks $t"; exit 3; }}; done
pip install --break-system-packages {deps}
pip install --break-system-packages --no-deps -e .
{_GIT} init -q .
{_GIT} add -A
{_GIT} commit -q -m "{repo.name} {repo.version} (sdist)"
"""
    check_step(ChrootStep([os_tree], dest, script), scratch, f"repository {repo.name}")


def build_harness(os_tree: Path, dest: Path, harness: HarnessSpec, scratch: Path) -> None:
    """The harness in its own prefix (venv or npm prefix), plus its Debian packages."""
    remove_tree(dest)
    if harness.kind == "pip-venv":
        p = shlex.quote(harness.prefix)
        script = f"python3 -m venv {p}\n{p}/bin/pip install {shlex.quote(harness.package)}\n"
    elif harness.kind == "npm":
        script = ""
    else:
        raise ValueError(f"unknown harness kind {harness.kind}")
    if harness.apt:
        pkgs = " ".join(shlex.quote(a) for a in harness.apt)
        script = (f"apt-get update -q\napt-get install -y -q --no-install-recommends {pkgs}\n"
                  f"apt-get clean\nrm -rf /var/lib/apt/lists/*\n") + script
    if script:
        check_step(ChrootStep([os_tree], dest, script), scratch, f"harness {harness.name}")
    if harness.kind == "npm":
        _npm_install(dest, harness)


def _npm_install(dest: Path, harness: HarnessSpec) -> None:
    # The host's npm writes straight into the tree's prefix: the OS tree needs no npm, and the
    # package (a native binary plus a small wrapper) runs without node.
    prefix = dest / harness.prefix.lstrip("/")
    prefix.mkdir(parents=True, exist_ok=True)
    if shutil.which("npm") is None:
        raise RuntimeFailure("npm is not installed on this host (needed for the claude-code harness)")
    proc = subprocess.run(
        ["npm", "install", "-g", "--no-fund", "--no-audit", "--prefix", str(prefix), harness.package],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    if proc.returncode != 0:
        raise RuntimeFailure(f"npm install {harness.package} failed:\n{proc.stdout.decode(errors='replace')[-3000:]}")


def check_harness(os_tree: Path, tree: Path, harness: HarnessSpec, scratch: Path) -> str:
    """Run the harness's entry command in a throwaway chroot of os + harness; returns its first line."""
    upper = scratch / f"check-{harness.name}"
    try:
        env_prefix = "MSWEA_CONFIGURED=true MSWEA_SILENT_STARTUP=1 "
        out = check_step(
            ChrootStep([tree, os_tree], upper, env_prefix + harness.entry + " </dev/null", network=False),
            scratch, f"harness {harness.name} entry check",
        )
    finally:
        remove_tree(upper)
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    versioned = [line for line in lines if "version" in line.lower()]
    return (versioned or lines or [""])[0][:200]


def build_evaluator(os_tree: Path, dest: Path, pytest_version: str, scratch: Path) -> None:
    """A pinned pytest (pip --target) and the scoring runner under EVAL_DIR."""
    remove_tree(dest)
    ev = shlex.quote(EVAL_DIR)
    # The pinned pytest is a FALLBACK (appended to sys.path by sitecustomize), never a shadow:
    # pytest's own dependencies (packaging, iniconfig...) must not hide the repository's code.
    script = f"""
mkdir -p {ev}/boot
pip install --break-system-packages --target {ev}/lib pytest=={shlex.quote(pytest_version)}
cp /tmp/rs-io/corpus_runner.py {ev}/corpus_runner.py
cat > {ev}/boot/sitecustomize.py <<'EOF'
import sys
sys.path.append("{EVAL_DIR}/lib")
EOF
cat > {ev}/score <<'EOF'
#!/bin/sh
# score TASK.json: run the task's tests (pytest: the repository's, else the evaluator's);
# prints one JSON verdict, exits 0 iff reward 1.0.
exec env PYTHONPATH={EVAL_DIR}/boot python3 {EVAL_DIR}/corpus_runner.py score "$@"
EOF
chmod 755 {ev}/score
"""
    io = scratch / "evaluator-io"
    io.mkdir(parents=True, exist_ok=True)
    shutil.copy(corpus_runner.__file__, io / "corpus_runner.py")
    try:
        check_step(ChrootStep([os_tree], dest, script, binds=[(io, "/tmp/rs-io")]), scratch, "evaluator")
    finally:
        remove_tree(io)
