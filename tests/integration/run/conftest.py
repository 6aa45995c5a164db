"""Fixtures for the runtime's integration tests (real overlayfs, runc, cgroups; root).

- `busybox_lower` (session): a minimal rootfs dir (static busybox + applet symlinks, /etc/passwd).
- `exec_mode`: "agent" (default), "agent-async" (the agent driven from an event loop:
  `Environment.exec_async`) or "runc"; parametrize it indirectly to run a suite on each.
- `runtime`: an `EnvironmentRuntime` under a fresh state dir; leftovers cleaned up at teardown.
- `wait_stopped`: `wait_stopped(env)` waits (up to 5 s) until the environment no longer runs.
- `make_env`: creates environments (`make_env(lowers=None, network=None, runtime_name="runc",
  prefix="t", **spec_kw)`), all destroyed at teardown even when the test failed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from components import require_tool
BUSYBOX = "/bin/busybox"


def _need(binary: str) -> None:
    require_tool(binary)


@pytest.fixture(scope="session")
def busybox_lower(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _need(BUSYBOX)
    _need("runc")
    root = tmp_path_factory.mktemp("busybox-lower")
    for d in ("bin", "etc", "root", "tmp", "work"):
        (root / d).mkdir()
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True,
                             check=True).stdout.split()
    for applet in applets:
        if applet != "busybox":
            os.symlink("busybox", root / "bin" / applet)
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    os.chmod(root / "tmp", 0o1777)
    return root


@pytest.fixture
def exec_mode(request: pytest.FixtureRequest) -> str:
    """How `runtime`'s environments run commands: "agent" (rollstack-execd, the default),
    "agent-async" (the same agent, each exec through `exec_async` on an event loop) or "runc"
    (`runc exec`). Modules parametrize it indirectly to run one suite on every path."""
    mode = getattr(request, "param", "agent")
    assert mode in ("agent", "agent-async", "runc"), mode
    return mode


@pytest.fixture
def runtime(tmp_path: Path, exec_mode: str):
    from rollstack.run.environment import EnvironmentRuntime, RuntimeConfig

    rt = EnvironmentRuntime(RuntimeConfig(root=tmp_path / "rt", exec_agent=exec_mode != "runc"))
    if exec_mode != "runc":  # CI must build it (make setup): never silently test runc twice
        assert rt.init.agent, "rollstack-execd is not built: run native/build.sh (make setup)"
    try:
        yield rt
    finally:
        rt.cleanup_leftovers()
        rt.close()  # the id mapping's user namespace fd (an unclosed one warns when collected)


class LoopExec:
    """An `Environment` whose `exec` goes through `exec_async` on an event loop (a fresh one per
    call, as a test has none); streaming and controlled execs have no loop form and stay sync."""

    def __init__(self, env) -> None:
        self._env = env

    def __getattr__(self, name: str):
        return getattr(self._env, name)

    def exec(self, cmd, *, on_output=None, control=None, **kw):
        import asyncio

        if on_output is not None or control is not None:
            return self._env.exec(cmd, on_output=on_output, control=control, **kw)
        return asyncio.run(self._env.exec_async(cmd, **kw))


@pytest.fixture
def make_env(runtime, busybox_lower: Path, exec_mode: str):
    from rollstack.run.ocispec import SpecParams

    created = []

    def make(lowers: list[Path] | None = None, *, network=None, runtime_name: str = "runc",
             prefix: str = "t", **spec_kw):
        env_id = f"{prefix}-{uuid.uuid4().hex[:12]}"
        env = runtime.create(env_id, lowers or [busybox_lower], SpecParams(env_id, **spec_kw),
                             network=network, runtime=runtime_name)
        created.append(env)
        return LoopExec(env) if exec_mode == "agent-async" else env

    try:
        yield make
    finally:
        for env in created:
            env.destroy()


@pytest.fixture
def wait_stopped():
    def wait(env, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while env.status() == "running" and time.monotonic() < deadline:
            time.sleep(0.05)

    return wait
