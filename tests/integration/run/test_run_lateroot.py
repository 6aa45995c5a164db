"""Late-bound sandboxes (rollstack.run.lateroot) on real runc, overlayfs and mount namespaces:
a container started on an empty root runs on the overlay bound later exactly as a cold one
would (root, mounts, masked and read-only paths, the exec agent), with and without a user
namespace; hostile roots are refused without touching the host; nothing is left behind."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from node_helpers import sh as _sh

from rollstack.errors import InvalidRequest, RuntimeFailure
from rollstack.run import lateroot
from rollstack.run.ocispec import SpecParams

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _built() -> None:
    assert lateroot.rootswitch() is not None, "rollstack-rootswitch is not built: make setup"


def _start(runtime, userns: bool):
    env_id = f"late-{uuid.uuid4().hex[:10]}"
    return lateroot.start(runtime, env_id, SpecParams(env_id), userns=userns)



def _mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(str(path))]


@pytest.mark.parametrize("userns", [False, True])
def test_a_sandbox_runs_on_the_root_bound_later(runtime, busybox_lower: Path, userns: bool) -> None:
    env = _start(runtime, userns)
    try:
        assert lateroot.unbound(env) and env.init_alive()
        lateroot.bind(env, [busybox_lower],
                      before_start=lambda root: (root / "root" / "marker").write_text("bound\n"))
        assert not lateroot.unbound(env)
        assert set(env.timings) >= {"mount", "mutation", "start"}
        assert _sh(env, "cat /root/marker") == "bound\n"
        mounts = {line.split()[4]: line for line in _sh(env, "cat /proc/self/mountinfo").splitlines()}
        assert " overlay rollstack " in mounts["/"] and str(env.upper) in mounts["/"]
        for point in ("/proc", "/dev", "/dev/pts", "/sys", "/.rollstack/init", "/proc/sys", "/proc/keys"):
            assert point in mounts, point  # moved over with the submounts the spec made
        assert "ro" in mounts["/proc/sys"].split()[5].split(",")
        assert _sh(env, "echo x > /proc/sys/kernel/hostname 2>/dev/null && echo wrote || echo refused") == "refused\n"
        expected = {".", "..", ".rollstack", "proc", "dev", "sys", *os.listdir(busybox_lower)}
        assert set(_sh(env, "ls -a /").split()) == expected  # the bound root: no skeleton left
        assert _sh(env, "id -u") == "0\n"
        assert _sh(env, "cat /proc/1/cmdline | tr '\\0' ' '").startswith("/.rollstack/init")
        _sh(env, "echo child > /root/mine")  # writes land in the environment's upper
        assert (env.upper / "root" / "mine").read_text() == "child\n"
        assert not (busybox_lower / "root" / "mine").exists()
        owner = (env.upper / ".rollstack" / "init").stat().st_uid
        assert owner == (100000 if userns else 0)  # the mount points the switch made: mapped root's
    finally:
        env.destroy()
    assert not env.dir.exists() and _mounts_under(env.dir) == []
    assert runtime.find_leftovers().empty()


def test_an_unbound_sandbox_is_destroyed_without_a_trace(runtime) -> None:
    env = _start(runtime, userns=True)
    assert _mounts_under(env.dir)  # its root bound onto itself (and published for the userns)
    env.destroy()
    assert not env.dir.exists() and _mounts_under(env.dir) == []
    assert runtime.find_leftovers().empty()


@pytest.mark.parametrize("name", ["proc", ".rollstack", "sys"])
def test_a_hostile_root_is_refused_or_contained_and_the_host_untouched(runtime, busybox_lower: Path, tmp_path: Path,
                                                         name: str) -> None:
    lower = tmp_path / "hostile"
    shutil.copytree(busybox_lower, lower, symlinks=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(str(outside), lower / name)  # a mount point that leads out of the root
    env = _start(runtime, userns=False)
    try:
        if name == ".rollstack":  # the sandbox's upper has its own /.rollstack: the link is shadowed
            lateroot.bind(env, [lower])
            assert _sh(env, "test -d /.rollstack && ! test -L /.rollstack && echo dir") == "dir\n"
        else:
            with pytest.raises(RuntimeFailure, match="rootswitch"):
                lateroot.bind(env, [lower])
        assert list(outside.iterdir()) == []  # nothing was made or mounted outside the root
        assert _mounts_under(outside) == []
        with pytest.raises(InvalidRequest):  # bound once, even when it failed: never again
            lateroot.bind(env, [busybox_lower])
    finally:
        env.destroy()
    assert runtime.find_leftovers().empty()


def test_a_group_binds_together_and_one_dead_member_fails_alone(runtime, busybox_lower: Path, wait_stopped) -> None:
    from rollstack.run import teardown

    envs = [_start(runtime, userns=True) for _ in range(3)]
    try:
        assert teardown.kill_init(envs[1])  # its PID 1 dies before the bind
        wait_stopped(envs[1])
        failed = lateroot.bind_many(envs, [busybox_lower],
                                    before_start=lambda root: (root / "root" / "marker").write_text("m\n"))
        assert list(failed) == [envs[1].id]
        for env in (envs[0], envs[2]):
            assert _sh(env, "cat /root/marker") == "m\n"
        assert (envs[0].dir / "idmap").is_dir() and not (envs[2].dir / "idmap").exists()  # views shared
        envs[0].destroy()  # the owner of the idmapped views goes: the sibling's overlay keeps its own
        assert _sh(envs[2], "ls /bin/busybox && cat /etc/passwd").startswith("/bin/busybox\nroot:")
        assert _sh(envs[2], "stat -c %u /etc/passwd") == "0\n"
    finally:
        for env in envs:
            env.destroy()
    assert runtime.find_leftovers().empty()


def test_a_switch_killed_at_its_timeout_keeps_the_targets_it_switched(runtime, busybox_lower: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The node kills a switch that outlives SWITCH_TIMEOUT_S; the targets it reported switched
    before (one line each, flushed as each ends) stay bound, the kill leaves no process."""
    real = lateroot.rootswitch()
    hang = tmp_path / "switch-then-hang"
    hang.write_text(f'#!/bin/sh\n"{real}" "$@"\nexec sleep 613\n')  # switches, then never exits
    hang.chmod(0o755)
    monkeypatch.setattr(lateroot, "rootswitch", lambda: str(hang))
    monkeypatch.setattr(lateroot, "SWITCH_TIMEOUT_S", 5.0)
    envs = [_start(runtime, userns=False) for _ in range(2)]
    try:
        assert lateroot.bind_many(envs, [busybox_lower]) == {}  # the kill came after both had switched
        for env in envs:
            assert _sh(env, "ls /bin/busybox") == "/bin/busybox\n"
    finally:
        for env in envs:
            env.destroy()
    assert runtime.find_leftovers().empty()
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p) == b"sleep\x00613\x00"]


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""
