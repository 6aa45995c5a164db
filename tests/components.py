"""What a test needs from the machine, said once: skip on a developer's machine, FAIL in CI.

CI (`bash .ci/run` on a clean clone, env `CI` set) installs every component in `make setup`
(scripts/setup-system.sh), so a missing one there is a broken setup and must not turn into a
green run of skips. On a developer's machine the same test skips and says what is missing.

    from components import need, require_root, require_tool
    require_tool("runc", "fusermount3")          # executables on PATH or absolute paths
    need(Path("/bin/busybox").exists(), "busybox-static (/bin/busybox)")
"""

from __future__ import annotations

import os
import shutil

import pytest


def in_ci() -> bool:
    """`CI` is set to anything but an explicit no (GitHub Actions, GitLab, .ci/run set `CI=true`)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def need(present: object, what: str) -> None:
    """Skip the calling test when `present` is falsy (fail instead when running in CI)."""
    if present:
        return
    if in_ci():
        pytest.fail(f"CI is missing {what}: scripts/setup-system.sh / make setup must provide it", pytrace=False)
    pytest.skip(f"{what} missing on this machine")


def require_tool(*names: str) -> None:
    """Every named executable must be on PATH (or be an executable absolute path)."""
    for name in names:
        need(shutil.which(name) is not None or (os.path.isabs(name) and os.access(name, os.X_OK)), name)


def require_root() -> None:
    """Integration tests run as root (CI does): skip as another user, fail in CI."""
    need(os.geteuid() == 0, "root (integration tests create mounts, cgroups and namespaces)")
