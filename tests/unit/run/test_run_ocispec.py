"""build_spec: the OCI runtime spec an environment gets (pure)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from rollstack.errors import InvalidRequest
from rollstack.run.ocispec import (
    DEFAULT_CAPABILITIES, EXEC_WRAPPER_PATH, INIT_PATH, MASKED_PATHS, MIN_CPU_QUOTA_US,
    SHELL_PATH, InitBinaries, SpecParams, build_spec, cgroup_path, cpu_quota,
)


def spec(**kw):
    return build_spec("/state/envs/e1/rootfs", SpecParams("e1", **kw))


def test_defaults_are_isolated():
    s = spec()
    assert s["root"] == {"path": "/state/envs/e1/rootfs", "readonly": False}
    p = s["process"]
    assert p["args"] == [INIT_PATH, "-P"] and p["terminal"] is False
    assert p["noNewPrivileges"] is True and p["user"] == {"uid": 0, "gid": 0}
    assert set(p["capabilities"]["bounding"]) == set(DEFAULT_CAPABILITIES)
    assert "CAP_SYS_ADMIN" not in p["capabilities"]["effective"]
    ns = {n["type"] for n in s["linux"]["namespaces"]}
    assert ns == {"pid", "network", "ipc", "uts", "mount", "cgroup"}
    assert all("path" not in n for n in s["linux"]["namespaces"])  # all new, none joined
    assert s["linux"]["cgroupsPath"] == "/rollstack/e1"
    assert s["linux"]["resources"]["pids"] == {"limit": 4096}
    assert s["linux"]["resources"]["devices"] == [{"allow": False, "access": "rwm"}]
    assert "cpu" not in s["linux"]["resources"] and "memory" not in s["linux"]["resources"]
    assert set(MASKED_PATHS) <= set(s["linux"]["maskedPaths"])
    assert "/proc/sys" in s["linux"]["readonlyPaths"]
    dests = {m["destination"]: m for m in s["mounts"]}
    for d in ("/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys", "/sys/fs/cgroup"):
        assert d in dests
    assert "ro" in dests["/sys"]["options"]
    assert "/tmp" not in dests  # /tmp stays on the overlay
    for path, src in ((INIT_PATH, "/usr/bin/catatonit"), (EXEC_WRAPPER_PATH,
                      "/usr/bin/tini-static"), (SHELL_PATH, "/bin/busybox")):
        assert dests[path]["source"] == src and "ro" in dests[path]["options"]
    env = dict(e.split("=", 1) for e in p["env"])
    assert env["PATH"].startswith("/usr/local/sbin") and env["HOME"] == "/root"
    sc = s["linux"]["seccomp"]
    assert sc["defaultAction"] == "SCMP_ACT_ALLOW"
    denied = {n for rule in sc["syscalls"] if "args" not in rule and rule["errnoRet"] == 1
              for n in rule["names"]}
    assert {"bpf", "keyctl", "mount", "kexec_load", "init_module"} <= denied
    userns = [r for r in sc["syscalls"] if r.get("args")]
    assert {n for r in userns for n in r["names"]} == {"clone", "unshare"}
    assert all(r["args"][0]["value"] == 0x10000000 for r in userns)
    assert "seccomp" not in spec(seccomp=False)["linux"]
    assert spec(arch="x86_64")["linux"]["seccomp"]["architectures"][0] == "SCMP_ARCH_X86_64"
    json.dumps(s)  # serializable


def test_resources_and_overrides():
    s = spec(cpu=1.5, memory=512 << 20, pids_limit=100, hostname="box-1", cwd="/work",
             env={"A": "1", "PATH": "/x"}, cgroup_parent="rs/test", nofile=2048,
             init=InitBinaries("/i", "/t", "/b"))
    r = s["linux"]["resources"]
    assert r["cpu"] == {"quota": 150_000, "period": 100_000}
    assert r["memory"] == {"limit": 512 << 20}
    assert r["pids"] == {"limit": 100}
    assert s["hostname"] == "box-1" and s["process"]["cwd"] == "/work"
    assert "PATH=/x" in s["process"]["env"] and "A=1" in s["process"]["env"]
    assert s["linux"]["cgroupsPath"] == "/rs/test/e1"
    assert s["process"]["rlimits"] == [{"type": "RLIMIT_NOFILE", "hard": 2048, "soft": 2048}]
    assert {m["source"] for m in s["mounts"] if m["type"] == "bind"} == {"/i", "/t", "/b"}
    assert "pids" not in spec(pids_limit=None)["linux"]["resources"]


@pytest.mark.parametrize("kw", [
    {"cpu": 0}, {"cpu": -1}, {"cpu": float("nan")}, {"memory": 1024}, {"pids_limit": 0},
    {"hostname": "bad host"}, {"hostname": "-x"}, {"hostname": "host\n"}, {"cwd": "relative"}, {"env": {"A=B": "x"}},
    {"env": {"": "x"}}, {"env": {"A": "x\x00y"}}, {"cgroup_parent": "../escape"},
    {"volumes": (("rel", "/data", False),)}, {"volumes": (("/v", "data", True),)},
    {"capabilities": ("sys_admin",)}, {"nofile": 1}, {"cpu_period_us": 10},
])
def test_bad_params_rejected(kw):
    with pytest.raises(InvalidRequest):
        spec(**kw)


@pytest.mark.parametrize("env_id", ["", "a b", "../x", "a/b", "-x", "x" * 200, "abc\n", ".."])
def test_bad_ids_rejected(env_id):
    with pytest.raises(InvalidRequest):
        build_spec("/r", SpecParams(env_id))


def test_rootfs_must_be_absolute():
    with pytest.raises(InvalidRequest):
        build_spec("rootfs", SpecParams("e1"))


@given(cores=st.floats(min_value=0.001, max_value=512, allow_nan=False),
       period=st.integers(min_value=1000, max_value=1_000_000))
def test_cpu_quota_tracks_cores(cores, period):
    q = cpu_quota(cores, period)
    assert q >= MIN_CPU_QUOTA_US
    if cores * period >= MIN_CPU_QUOTA_US:
        assert abs(q - cores * period) <= 0.5 + 1e-6 * cores * period
    s = spec(cpu=cores, cpu_period_us=period)
    assert s["linux"]["resources"]["cpu"] == {"quota": q, "period": period}


@given(env_id=st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,40}\Z"),
       env=st.dictionaries(st.text(st.characters(blacklist_characters="=\x00"), min_size=1,
                                   max_size=10),
                           st.text(st.characters(blacklist_characters="\x00"), max_size=20),
                           max_size=5),
       memory=st.none() | st.integers(min_value=8 << 20, max_value=1 << 40),
       pids=st.none() | st.integers(min_value=8, max_value=1 << 22))
def test_any_valid_params_build_a_consistent_spec(env_id, env, memory, pids):
    s = build_spec("/r", SpecParams(env_id, env=env, memory=memory, pids_limit=pids))
    assert s["linux"]["cgroupsPath"] == cgroup_path(env_id) == f"/rollstack/{env_id}"
    got = dict(e.split("=", 1) for e in s["process"]["env"])
    for k, v in env.items():
        assert got[k] == v
    res = s["linux"]["resources"]
    assert res.get("memory", {}).get("limit") == memory
    assert res.get("pids", {}).get("limit") == pids
    assert json.loads(json.dumps(s)) == s


def test_volumes_are_bind_mounts_read_only_when_asked():
    s = spec(volumes=(("/srv/v/a/data", "/data", True), ("/srv/v/b/data", "/work/out", False)))
    binds = {m["destination"]: m for m in s["mounts"] if m["type"] == "bind"}
    assert binds["/data"]["source"] == "/srv/v/a/data" and "ro" in binds["/data"]["options"]
    assert binds["/work/out"]["source"] == "/srv/v/b/data" and "rw" in binds["/work/out"]["options"]
    assert all({"nosuid", "nodev"} <= set(binds[d]["options"]) for d in ("/data", "/work/out"))


def test_network_namespace_joined_by_path():
    fresh = build_spec("/r", SpecParams("e1"))["linux"]["namespaces"]
    assert {"type": "network"} in fresh
    joined = build_spec("/r", SpecParams("e1", netns_path="/run/netns/rsn-3"))["linux"]["namespaces"]
    assert {"type": "network", "path": "/run/netns/rsn-3"} in joined
    assert [n["type"] for n in joined] == [n["type"] for n in fresh]
    with pytest.raises(InvalidRequest, match="netns path"):
        build_spec("/r", SpecParams("e1", netns_path="run/netns/x"))


def test_user_namespace_mappings():
    plain = build_spec("/r", SpecParams("e1"))["linux"]
    assert "uidMappings" not in plain and {"type": "user"} not in plain["namespaces"]
    linux = build_spec("/r", SpecParams("e1", userns_map=(100000, 65536)))["linux"]
    assert {"type": "user"} in linux["namespaces"]
    assert linux["uidMappings"] == linux["gidMappings"] == [
        {"containerID": 0, "hostID": 100000, "size": 65536}]
    with pytest.raises(InvalidRequest, match="user namespace mapping"):
        build_spec("/r", SpecParams("e1", userns_map=(0, 65536)))  # host root is never the target
