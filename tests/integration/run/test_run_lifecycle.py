"""Create/destroy leave nothing behind; crash leftovers are found and cleaned; files API and diff
on a live environment; long layer stacks mount."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from rollstack.errors import InvalidRequest, UnsafePath
from rollstack.run import cgroupfs, overlay
from rollstack.run.environment import EnvironmentRuntime, RuntimeConfig
from rollstack.run.ocispec import SpecParams

pytestmark = pytest.mark.integration


def _traces(rt: EnvironmentRuntime, env_id: str) -> dict:
    mounts = [mp for mp, _ in overlay.mount_points() if env_id in mp]
    return {
        "mounts": mounts,
        "cgroups": [str(p) for p in cgroupfs.env_cgroup_dirs(env_id)],
        "runc": (rt.runc.root / env_id).exists(),
        "dir": rt.env_dir(env_id).exists(),
    }


def _env_pids(env_id: str) -> list[int]:
    pids: list[int] = []
    for cg in cgroupfs.env_cgroup_dirs(env_id):
        try:
            pids += [int(x) for x in (cg / "cgroup.procs").read_text().split()]
        except OSError:
            pass
    return sorted(set(pids))


def test_destroy_leaves_nothing_and_is_idempotent(runtime, busybox_lower):
    env_id = f"t-{uuid.uuid4().hex[:12]}"
    env = runtime.create(env_id, [busybox_lower], SpecParams(env_id, memory=64 << 20, cpu=1))
    try:
        assert set(env.timings) == {"mount", "start"}
        assert env.status() == "running"
        assert overlay.is_mounted(env.rootfs)
        assert len(cgroupfs.env_cgroup_dirs(env_id)) >= 1
        env.exec("sleep 1000 & echo x > /work/x")
        pids = _env_pids(env_id)
        assert env.pid in pids and len(pids) >= 2  # init + the background sleep
    finally:
        env.destroy()
    assert _traces(runtime, env_id) == {"mounts": [], "cgroups": [], "runc": False,
                                        "dir": False}
    for pid in pids:  # killed and reaped: not even a zombie is left
        assert not Path(f"/proc/{pid}").exists()
    env.destroy()  # again: no error
    assert runtime.find_leftovers().empty()
    from rollstack.errors import EnvironmentGone
    for use in (lambda: env.files, env.diff, lambda: env.exec("true")):
        with pytest.raises(EnvironmentGone):
            use()


def test_create_failure_cleans_up(runtime, busybox_lower, tmp_path):
    env_id = f"t-{uuid.uuid4().hex[:12]}"
    with pytest.raises(Exception):
        runtime.create(env_id, [busybox_lower, tmp_path / "missing"], SpecParams(env_id))
    assert not runtime.env_dir(env_id).exists()

    def boom(rootfs: Path) -> None:
        (rootfs / "work" / "mutated").write_text("x")
        raise RuntimeError("mutation failed")

    with pytest.raises(RuntimeError):
        runtime.create(env_id, [busybox_lower], SpecParams(env_id), before_start=boom)
    assert _traces(runtime, env_id)["mounts"] == [] and not runtime.env_dir(env_id).exists()
    with pytest.raises(InvalidRequest):
        runtime.create("bad id!", [busybox_lower], SpecParams("bad id!"))


def test_before_start_hook_and_timings(make_env, runtime, busybox_lower):
    env_id = f"t-{uuid.uuid4().hex[:12]}"

    def mutate(rootfs: Path) -> None:
        (rootfs / "work" / "task.txt").write_text("mutated\n")

    env = runtime.create(env_id, [busybox_lower], SpecParams(env_id), before_start=mutate)
    try:
        assert set(env.timings) == {"mount", "mutation", "start"}
        assert env.exec("cat /work/task.txt").stdout == b"mutated\n"
    finally:
        env.destroy()


def test_leftovers_after_simulated_crash(tmp_path, busybox_lower):
    root = tmp_path / "crashy"
    rt = EnvironmentRuntime(RuntimeConfig(root=root))
    ids = [f"t-{uuid.uuid4().hex[:12]}" for _ in range(2)]
    try:
        for env_id in ids:
            env = rt.create(env_id, [busybox_lower], SpecParams(env_id))
            env.exec("sleep 1000 &")
        del env, rt  # "forget" them: the agent crashed
        rt2 = EnvironmentRuntime(RuntimeConfig(root=root))
        left = rt2.find_leftovers()
        assert sorted(left.envs) == sorted(ids) == sorted(left.containers)
        # one overlay each, plus (user namespaces, on by default) the idmapped lower clones
        assert len([m for m in left.mounts if m.endswith("/rootfs")]) == 2 and len(left.cgroups) >= 2
        # re-adoption works too
        assert rt2.open(ids[0]).exec("echo adopted").stdout == b"adopted\n"
        from rollstack.run import cleanup_leftovers, find_leftovers
        assert sorted(find_leftovers(root).envs) == sorted(ids)
        cleanup_leftovers(root)
        assert rt2.find_leftovers().empty()
        from rollstack.run.userns import public_rootfs
        assert not any(public_rootfs(rt2.env_dir(i)).exists() for i in ids)  # the binds for runc
        for env_id in ids:
            assert _traces(rt2, env_id)["mounts"] == []
            assert _traces(rt2, env_id)["cgroups"] == []
    finally:
        EnvironmentRuntime(RuntimeConfig(root=root)).cleanup_leftovers()


def test_files_api_on_live_environment(make_env):
    env = make_env()
    r = env.exec("ln -s /etc/passwd /work/pw; ln -s ../../../../../../etc/shadow /work/up; "
                 "ln -s /proc/1/root /work/r; echo in-env > /work/f")
    assert r.exit_code == 0
    fs = env.files
    assert fs.read_file("/work/f") == b"in-env\n"
    for p in ("/work/pw", "/work/up", "/work/r/etc/passwd", "/../etc/passwd"):
        with pytest.raises(UnsafePath):
            fs.read_file(p)
        with pytest.raises(UnsafePath):
            fs.write_file(p, b"pwned")
    fs.write_file("/work/new/dir/g.txt", b"from api")
    assert env.exec("cat /work/new/dir/g.txt").stdout == b"from api"
    assert "root:x:0:0" in Path("/etc/passwd").read_text()


def test_diff_of_live_environment_applies_with_git(make_env, busybox_lower, tmp_path):
    env = make_env()
    r = env.exec("cd /work && printf 'a\\nb\\n' > new.txt && rm /etc/group && "
                 "echo 'root:x:0:0:root:/root:/bin/ash' > /etc/passwd && mkdir -p /tmp/x && "
                 "echo noise > /tmp/x/n")
    assert r.exit_code == 0, r
    patch = env.diff()
    assert "tmp/x" not in patch and ".rollstack" not in patch and "proc" not in patch
    orig = tmp_path / "orig"
    subprocess.run(["cp", "-a", str(busybox_lower), str(orig)], check=True)
    proc = subprocess.run(["git", "apply", "-"], cwd=orig, input=patch.encode(),
                          capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert (orig / "work/new.txt").read_text() == "a\nb\n"
    assert not (orig / "etc/group").exists()
    assert (orig / "etc/passwd").read_text().endswith("/bin/ash\n")
    rel = env.diff(base="/work")
    assert rel.startswith("diff --git a/new.txt b/new.txt\nnew file mode 100644\n")


def test_many_layers_beyond_the_page_limit(tmp_path, busybox_lower):
    # 60 layers with long paths: a single lowerdir= string would be > 4096 bytes.
    layers = []
    for i in range(60):
        d = tmp_path / ("layer-" + "x" * 80 + f"-{i:03d}")
        d.mkdir()
        (d / f"f{i}").write_text(str(i))
        layers.append(d)
    assert len(overlay.classic_options(layers, tmp_path, tmp_path)) > overlay.PAGE_LIMIT
    for d in ("u", "w", "m"):
        (tmp_path / d).mkdir()
    overlay.mount_overlay(layers + [busybox_lower], tmp_path / "u", tmp_path / "w",
                          tmp_path / "m")
    try:
        assert overlay.is_mounted(tmp_path / "m")
        assert (tmp_path / "m" / "f0").read_text() == "0"
        assert (tmp_path / "m" / "f59").read_text() == "59"
        assert (tmp_path / "m" / "bin" / "busybox").exists()
    finally:
        overlay.unmount(tmp_path / "m")
        overlay.unmount(tmp_path / "m")
    assert not overlay.is_mounted(tmp_path / "m")


def test_the_overlay_is_volatile(tmp_path, busybox_lower):
    """An environment's upper is thrown away with it: overlayfs is asked never to sync it, so an
    unmount (every destroy) does not write back the node's whole filesystem."""
    for d in ("u", "w", "m"):
        (tmp_path / d).mkdir()
    overlay.mount_overlay([busybox_lower], tmp_path / "u", tmp_path / "w", tmp_path / "m")
    try:
        target = os.fspath(tmp_path / "m")
        lines = [ln for ln in Path("/proc/self/mountinfo").read_text().splitlines() if ln.split()[4] == target]
        assert lines, target
        fstype, source, super_options = lines[-1].split(" - ", 1)[1].split()[:3]
        assert (fstype, source) == ("overlay", overlay.MOUNT_SOURCE)
        opts = super_options.split(",")
        assert "volatile" in opts or "fsync=volatile" in opts, super_options  # newer kernels say fsync=
        (tmp_path / "m" / "written").write_text("x")
        fd = os.open(tmp_path / "m" / "written", os.O_RDONLY)
        try:
            os.fsync(fd)  # a no-op on a volatile overlay, never an error
        finally:
            os.close(fd)
        assert (tmp_path / "u" / "written").read_text() == "x"
    finally:
        overlay.unmount(tmp_path / "m")


def test_unmount_busy_falls_back_to_lazy(tmp_path, busybox_lower):
    for d in ("u", "w", "m"):
        (tmp_path / d).mkdir()
    overlay.mount_overlay([busybox_lower], tmp_path / "u", tmp_path / "w", tmp_path / "m")
    fd = os.open(tmp_path / "m" / "bin", os.O_RDONLY)  # keeps the mount busy
    try:
        overlay.unmount(tmp_path / "m")
        assert not overlay.is_mounted(tmp_path / "m")
    finally:
        os.close(fd)


def test_bad_overlay_input(tmp_path):
    with pytest.raises(InvalidRequest):
        overlay.mount_overlay([], tmp_path, tmp_path, tmp_path)
    with pytest.raises(InvalidRequest):
        overlay.mount_overlay([tmp_path / "nope"], tmp_path, tmp_path, tmp_path)
    bad = tmp_path / "a,b"
    bad.mkdir()
    with pytest.raises(InvalidRequest):
        overlay.mount_overlay([bad], tmp_path, tmp_path, tmp_path)


@pytest.mark.parametrize("exec_mode", ["runc"], indirect=True)
def test_destroy_after_a_runc_exec_was_killed(make_env, runtime):
    """The command's runc dies: its tree is re-parented to us; destroy must still finish."""
    import threading
    import time

    env = make_env()
    results = []
    th = threading.Thread(target=lambda: results.append(env.exec("sleep 300")))
    th.start()
    pattern = f"--root\0{runtime.runc.root}\0exec\0".encode()

    def runc_execs() -> list[str]:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if pattern in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(pid)
            except OSError:
                pass
        return found

    for _ in range(200):
        out = runc_execs()
        if out:
            break
        time.sleep(0.02)
    assert len(out) == 1
    time.sleep(0.3)  # let the command start
    os.kill(int(out[0]), 9)
    th.join(10)
    assert not th.is_alive() and results and results[0].exit_code == 137
    env.destroy()
    assert _traces(runtime, env.id) == {"mounts": [], "cgroups": [], "runc": False, "dir": False}


@pytest.mark.parametrize("bad", ["..", "../../etc", "a/b", "x\n", ""])
def test_ids_that_would_be_paths_are_refused(runtime, bad):
    victim = runtime.root / "keep"
    victim.mkdir()
    with pytest.raises(InvalidRequest):
        runtime.open(bad)
    from rollstack.run.environment import Environment
    with pytest.raises(InvalidRequest):
        Environment(runtime, bad).destroy()
    assert victim.is_dir()
