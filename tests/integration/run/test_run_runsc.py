"""The gVisor tier: the same environment API under runsc (ptrace platform)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollstack.errors import RuntimeFailure
from rollstack.plan.network import parse_allow
from rollstack.run import cgroupfs
from rollstack.run.environment import EnvironmentRuntime, RuntimeConfig
from rollstack.run.network import resolve_spec
from rollstack.run.ocispec import SpecParams

pytestmark = pytest.mark.integration


@pytest.fixture
def gvisor_env(make_env):
    def make(network=None, **kw):
        return make_env(network=network, runtime_name="runsc", prefix="g", **kw)

    return make


def test_runs_under_gvisor_with_the_same_api(gvisor_env):
    env = gvisor_env(memory=256 << 20, cpu=1)
    assert env.runtime_name == "runsc"
    # gVisor's own kernel answers, not the host's
    assert b"4.4.0" in env.exec("uname -r").stdout
    r = env.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr) == (3, b"out\n", b"err\n")
    assert env.exec("cat", stdin=b"piped").stdout == b"piped"
    r = env.exec("sleep 30", timeout=1)
    assert r.timed_out and r.exit_code == 124
    assert env.exec(["sh", "-c", "pwd; echo $X"], cwd="/tmp", env={"X": "1"}).stdout == b"/tmp\n1\n"
    env.exec("mkdir -p /work && echo y > /work/z && rm /etc/passwd")
    d = env.diff()
    assert "+++ b/work/z" in d and "deleted file" in d  # writes landed in the overlay upper
    env.files.write_file("/work/from-host", b"hi")
    assert env.exec("cat /work/from-host").stdout == b"hi"


def test_the_hosts_dev_null_stays_as_it_was(gvisor_env):
    """runsc hands its stdio to the sandbox's user: it must not be the host's /dev/null (it was:
    gVisor environments chowned it to nobody)."""
    import os

    before = os.stat("/dev/null")
    env = gvisor_env()
    assert env.exec("echo ok").stdout == b"ok\n"
    after = os.stat("/dev/null")
    assert (after.st_uid, after.st_gid, after.st_mode) == (before.st_uid, before.st_gid, before.st_mode)
    assert (after.st_uid, after.st_gid) == (0, 0)


def test_quotas_are_the_sandbox_cgroup(gvisor_env):
    env = gvisor_env(memory=256 << 20, cpu=1)
    dirs = cgroupfs.env_cgroup_dirs(env.id, env.runtime.config.cgroup_parent)
    assert dirs and env.pid in {p for cg in dirs for p in cgroupfs.cgroup_procs(cg)}
    env.update(memory=300 << 20, cpu=0.5)
    values = {f.name: f.read_text().strip() for cg in dirs
              for f in (cg / "memory.limit_in_bytes", cg / "memory.max", cg / "cpu.cfs_quota_us",
                        cg / "cpu.max") if f.exists()}
    assert str(300 << 20) in values.values()
    assert "50000" in values.get("cpu.cfs_quota_us", values.get("cpu.max", ""))


def test_an_allow_policy_under_gvisor(runtime, busybox_lower, tmp_path):
    """gVisor's netstack takes the prepared netns over (the /proc/sys/net workaround in
    rollstack.run.runsc): the policy on the host side holds exactly as under runc."""
    from rollstack_bench.netlab import Upstream

    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "hello").write_text("hi from upstream\n")
    up = Upstream(tmp_path / "www")
    try:
        up.serve(8000)
        up.serve(8001)
        spec = resolve_spec("allow", [parse_allow(f"{up.addr}:8000")], [])
        env = runtime.create("g-net", [busybox_lower], SpecParams("g-net"), network=spec, runtime="runsc")
        try:
            assert "4.4.0" in env.exec("uname -r").stdout.decode()  # really gVisor's kernel
            r = env.exec(f"timeout 5 wget -q -O - http://{up.addr}:8000/hello", timeout=30)
            assert (r.exit_code, r.stdout) == (0, b"hi from upstream\n"), r
            assert env.exec(f"timeout 3 wget -q -O - http://{up.addr}:8001/hello", timeout=30).exit_code != 0
            gw = env.net.gateway
            assert env.exec(f"timeout 3 wget -q -O - http://{gw}:8000/", timeout=30).exit_code != 0  # the node
        finally:
            env.destroy()
        assert not runtime.env_dir("g-net").exists() and runtime.find_leftovers().empty()
        assert runtime.network.owned(f"{runtime.root}:") == []
    finally:
        up.close()


def test_no_network_under_gvisor(gvisor_env):
    env = gvisor_env()
    assert env.net is None
    assert env.exec("cat /proc/net/dev").stdout.count(b":") <= 2  # lo only (header has none)
    assert env.exec("timeout 3 wget -q -O - http://10.214.0.2:8000/", timeout=20).exit_code != 0


def test_runsc_missing_is_a_runtime_failure_that_creates_nothing(tmp_path, busybox_lower):
    rt = EnvironmentRuntime(RuntimeConfig(root=tmp_path / "rt", runsc_binary="/nonexistent/runsc",
                                          subreaper=False))
    with pytest.raises(RuntimeFailure, match=r"^runtime: runsc is not installed"):
        rt.create("g-missing", [busybox_lower], SpecParams("g-missing"), runtime="runsc")
    assert not rt.env_dir("g-missing").exists() and rt.find_leftovers().empty()
    assert not Path(tmp_path / "rt" / "runsc").exists()
