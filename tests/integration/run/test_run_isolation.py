"""Isolation and limits of a real environment: host files, network, pids, memory, neighbours;
each on a cold start and on a late-bound sandbox (rollstack.run.lateroot: started on an empty
root, its root switched in afterwards), which must hold every one of them alike."""

from __future__ import annotations

import os
import uuid

import pytest

from components import need
pytestmark = pytest.mark.integration


@pytest.fixture(params=["cold", "late-bound"])
def make_env(request, make_env, runtime, busybox_lower):
    """The conftest's `make_env`, or the same environment made late-bound."""
    from rollstack.run import lateroot
    from rollstack.run.ocispec import SpecParams

    if request.param == "cold":
        yield make_env
        return
    assert lateroot.rootswitch() is not None, "rollstack-rootswitch is not built: make setup"
    made = []

    def make(lowers=None, *, network=None, runtime_name="runc", prefix="t", **spec_kw):
        assert network is None and runtime_name == "runc", "late-bound sandboxes: runc, no network"
        env_id = f"{prefix}-{uuid.uuid4().hex[:12]}"
        env = lateroot.start(runtime, env_id, SpecParams(env_id, **spec_kw))
        made.append(env)
        lateroot.bind(env, lowers or [busybox_lower])
        return env

    try:
        yield make
    finally:
        for env in made:
            env.destroy()


def test_cannot_see_host_files_or_processes(make_env, tmp_path):
    secret = tmp_path / f"host-secret-{uuid.uuid4().hex}"
    secret.write_text("top secret")
    env = make_env()
    r = env.exec(f"cat {secret}; ls /; ls /work")
    assert b"top secret" not in r.stdout
    assert r.exit_code == 0
    assert env.exec(f"test -e {secret}").exit_code == 1
    # The host's /etc/os-release does not exist in a busybox root.
    assert env.exec("test -e /etc/os-release").exit_code == 1
    # pid namespace: only the init, the exec wrappers and ps itself.
    ps = env.exec(["ps", "-o", "pid,args"]).stdout.decode().splitlines()[1:]
    cmds = [line.split(None, 1)[1] for line in ps]
    assert all(c.startswith(("/.rollstack/", "ps")) for c in cmds), cmds
    assert env.exec("echo $$").stdout.strip().isdigit()
    assert b"/.rollstack/init" in env.exec("cat /proc/1/cmdline").stdout


def test_network_is_loopback_only_and_up(make_env):
    env = make_env()
    dev = env.exec("cat /proc/net/dev").stdout.decode().splitlines()[2:]
    assert [line.split(":")[0].strip() for line in dev] == ["lo"]
    link = env.exec("ip link").stdout.decode()
    assert "lo:" in link and ",UP" in link
    # loopback works: a server and a client inside the environment. Every step waits on a
    # condition (the listener in /proc/net/tcp{,6}, a delivered line) with a generous deadline: on
    # a loaded machine a bounded count of retries ran out before the listener was scheduled.
    r = env.exec("end=$(($(date +%s) + 150)); "
                 # the listener's stdin never ends: a listener that met EOF on it could go before
                 # it read the line (seen under load)
                 "(sleep 200 2>/dev/null | nc -l -p 8080 > /tmp/got 2>/dev/null) 2>/dev/null & "
                 "until cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | grep -qE ':1F90 0+:0000 0A'; do "
                 "[ $(date +%s) -lt $end ] || { echo no-listener; exit 3; }; sleep 0.1; done; "
                 "until echo ping | nc -w 10 127.0.0.1 8080; do "
                 "[ $(date +%s) -lt $end ] || { echo no-connect; exit 4; }; sleep 0.2; done; "
                 "until grep -q ping /tmp/got; do "
                 "[ $(date +%s) -lt $end ] || { echo not-delivered; exit 5; }; sleep 0.1; done; "
                 "cat /tmp/got", timeout=300)
    assert r.exit_code == 0 and b"ping" in r.stdout, r


def test_other_environments_files_and_processes_are_invisible(make_env):
    a, b = make_env(), make_env()
    assert a.exec("echo from-a > /work/a.txt; sleep 60 &").exit_code == 0
    assert b.exec("test -e /work/a.txt").exit_code == 1
    assert b"sleep 60" not in b.exec(["ps", "-o", "args"]).stdout
    assert a.files.read_file("/work/a.txt") == b"from-a\n"
    assert not b.files.exists("/work/a.txt")


def test_hostname_caps_and_readonly_sys(make_env):
    env = make_env(hostname="envhost")
    assert env.exec("hostname").stdout == b"envhost\n"
    assert env.exec("touch /sys/x").exit_code != 0
    assert env.exec("echo 1 > /proc/sysrq-trigger").exit_code != 0
    status = env.exec("cat /proc/self/status").stdout.decode()
    assert "NoNewPrivs:\t1" in status
    cap_bnd = int(next(l for l in status.splitlines() if l.startswith("CapBnd")).split()[1], 16)
    assert not cap_bnd & (1 << 21)  # no CAP_SYS_ADMIN
    assert env.exec("mount -t tmpfs none /mnt").exit_code != 0


def test_fork_bomb_is_contained_by_pids_limit(make_env):
    bomb = make_env(pids_limit=64, cpu=0.5)
    neighbour = make_env()
    r = bomb.exec("b() { b | b & }; b; sleep 2", timeout=4)
    # whatever the bomb's shell made of failed forks, the limit held it:
    pids_dir = f"/sys/fs/cgroup/pids/rollstack/{bomb.id}"
    if os.path.isdir(pids_dir):  # v1 (this host); v2 has the same files in the unified dir
        assert int(open(f"{pids_dir}/pids.max").read()) == 64
        events = open(f"{pids_dir}/pids.events").read().split()
        assert int(events[events.index("max") + 1]) > 0, r  # forks were refused at the limit
        assert int(open(f"{pids_dir}/pids.current").read()) <= 64
    # the neighbour and the host still work
    assert neighbour.exec("echo fine").stdout == b"fine\n"
    assert os.system("true") == 0
    bomb.destroy()
    assert neighbour.exec("echo still fine").stdout == b"still fine\n"


def test_memory_hog_stays_within_its_limit(make_env):
    env = make_env(memory=64 * 1024 * 1024)
    neighbour = make_env()
    # 200 MiB of shell string growth: the cgroup OOM killer ends it, not the host's.
    r = env.exec("x=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa; while :; do x=$x$x; done",
                 timeout=30)
    assert not r.timed_out and r.exit_code in (137, 139), r
    assert env.oom_kills() >= 1
    assert env.exec("echo alive").stdout == b"alive\n"  # the environment itself survives
    assert neighbour.exec("echo fine").stdout == b"fine\n"


def test_update_quotas_live(make_env):
    env = make_env(cpu=0.5, memory=128 * 1024 * 1024)
    cpu_dir = f"/sys/fs/cgroup/cpu/rollstack/{env.id}"
    mem_dir = f"/sys/fs/cgroup/memory/rollstack/{env.id}"
    need(os.path.isdir(cpu_dir), "a cgroup v1 cpu hierarchy")
    assert int(open(f"{cpu_dir}/cpu.cfs_quota_us").read()) == 50_000
    env.update(cpu=1.5, memory=256 * 1024 * 1024)
    assert int(open(f"{cpu_dir}/cpu.cfs_quota_us").read()) == 150_000
    assert int(open(f"{mem_dir}/memory.limit_in_bytes").read()) == 256 * 1024 * 1024
    # the provisioner writes the cgroup files directly: growing memory must not hit memsw
    with open(f"{mem_dir}/memory.limit_in_bytes", "w") as f:
        f.write(str(1024 * 1024 * 1024))
    assert int(open(f"{mem_dir}/memory.limit_in_bytes").read()) == 1024 * 1024 * 1024
    env.update(memory=128 * 1024 * 1024)
    assert int(open(f"{mem_dir}/memory.limit_in_bytes").read()) == 128 * 1024 * 1024


def test_seccomp_denies_user_namespaces_and_kernel_surfaces(make_env):
    env = make_env()
    r = env.exec("unshare -U true")
    assert r.exit_code != 0 and b"not permitted" in r.stderr.lower() + r.stdout.lower(), r
    # ordinary process creation (clone without NEWUSER, clone3 falling back) still works
    assert env.exec("sh -c 'sleep 0 & wait; echo ok'").stdout == b"ok\n"
    assert env.exec("grep Seccomp: /proc/self/status").stdout.split()[1] == b"2"
    plain = make_env(seccomp=False)
    assert plain.exec("grep Seccomp: /proc/self/status").stdout.split()[1] == b"0"
    assert plain.exec("unshare -U true").exit_code == 0  # what the profile takes away
