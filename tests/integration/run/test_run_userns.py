"""User namespaces (opt-in): root inside is host uid 100000, layers keep their owners inside."""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

import pytest

from rollstack_bench.netlab import Upstream
from rollstack.errors import RuntimeFailure
from rollstack.plan.network import parse_allow
from rollstack.run import userns
from rollstack.run.environment import EnvironmentRuntime, RuntimeConfig
from rollstack.run.network import resolve_spec
from rollstack.run.ocispec import SpecParams

pytestmark = pytest.mark.integration


@pytest.fixture
def open_runtime():
    """A runtime under a root the mapped uid can traverse (pytest's tmp dirs are 0700)."""
    base = Path(tempfile.mkdtemp(prefix="rsn-userns-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    rt = EnvironmentRuntime(RuntimeConfig(root=base / "rt", subreaper=False))
    try:
        yield rt
    finally:
        rt.cleanup_leftovers()
        rt.close()
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def _make(rt, lower, **kw):
    env_id = f"u-{uuid.uuid4().hex[:10]}"
    return rt.create(env_id, [lower], SpecParams(env_id), userns=True, **kw)


def test_root_inside_is_unprivileged_outside_and_owners_show(open_runtime, busybox_lower):
    env = _make(open_runtime, busybox_lower)
    try:
        assert env.exec("cat /proc/self/uid_map").stdout.split() == [b"0", b"100000", b"65536"]
        r = env.exec("id -u; stat -c '%u %g' /bin/busybox /etc/passwd; "
                     "echo hi > /work/new && mkdir /work/d && chown 1000:1000 /work/d && "
                     "echo ok >> /etc/passwd && echo wrote")
        assert r.stdout.decode().split("\n")[:4] == ["0", "0 0", "0 0", "wrote"], r
        # the host sees the mapped owners in the upper, and the init runs as host uid 100000
        assert os.stat(env.upper / "work" / "new").st_uid == userns.HOST_BASE
        assert os.stat(env.upper / "work" / "d").st_uid == userns.HOST_BASE + 1000
        status = Path(f"/proc/{env.pid}/status").read_text()
        assert f"Uid:\t{userns.HOST_BASE}\t" in status
        d = env.diff()
        assert "+++ b/work/new" in d and "+ok" in d  # diff is owner-blind: unchanged
    finally:
        env.destroy()
    assert not env.dir.exists()
    assert open_runtime.find_leftovers().empty()


def test_userns_with_an_allow_policy(open_runtime, busybox_lower, tmp_path):
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "hello").write_text("hi\n")
    up = Upstream(tmp_path / "www")
    try:
        up.serve(8000)
        up.serve(8001)
        env = _make(open_runtime, busybox_lower,
                    network=resolve_spec("allow", [parse_allow(f"{up.addr}:8000")], []))
        try:
            r = env.exec(f"timeout 5 wget -q -O - http://{up.addr}:8000/hello", timeout=20)
            assert (r.exit_code, r.stdout) == (0, b"hi\n"), r
            assert env.exec(f"timeout 3 wget -q -O - http://{up.addr}:8001/hello", timeout=20).exit_code != 0
            assert env.exec("ip addr add 10.213.255.250/30 dev eth0").exit_code != 0  # no CAP_NET_ADMIN
        finally:
            env.destroy()
        assert open_runtime.network.owned(f"{open_runtime.root}:") == []
    finally:
        up.close()


def test_default_is_on_even_under_a_closed_root(runtime, busybox_lower):
    """No `userns` argument: on (this kernel supports it). pytest's tmp dirs are 0700, which
    the mapped root cannot walk: runc then gets a bind of the rootfs under /run/rollstack-userns,
    removed again on destroy. The files API creates files owned by the mapped root and reports
    owners as seen inside."""
    env = runtime.create("u-default", [busybox_lower], SpecParams("u-default"))
    public = userns.public_rootfs(env.dir)
    try:
        assert env.meta()["userns"] is True
        assert os.path.ismount(public)
        assert env.exec("cat /proc/self/uid_map").stdout.split() == [b"0", b"100000", b"65536"]
        env.files.write_file("/work/from-api/hello.txt", b"hi\n")
        assert os.stat(env.upper / "work/from-api/hello.txt").st_uid == userns.HOST_BASE
        assert os.stat(env.upper / "work/from-api").st_uid == userns.HOST_BASE
        r = env.exec("stat -c '%u' /work/from-api/hello.txt && echo more >> /work/from-api/hello.txt"
                     " && chown 1000 /work/from-api/hello.txt && echo ok")
        assert r.stdout.split() == [b"0", b"ok"], r
        from rollstack.run.fsops import TreeRoot

        tree = TreeRoot(env.rootfs, userns.HOST_BASE)
        assert (tree.entry("/work/from-api/hello.txt").uid, tree.entry("/bin/busybox").uid) == (1000, 0)
    finally:
        env.destroy()
    assert not public.exists() and not env.dir.exists()
    assert runtime.find_leftovers().empty()


def test_opt_out_and_insisting(runtime, busybox_lower):
    env = runtime.create("u-off", [busybox_lower], SpecParams("u-off"), userns=False)
    try:
        assert env.meta()["userns"] is False
        assert env.exec("cat /proc/self/uid_map").stdout.split() == [b"0", b"0", b"4294967295"]
    finally:
        env.destroy()
    with pytest.raises(RuntimeFailure, match=r"^security.userns: not available with runtime: runsc"):
        runtime.create("u-sc", [busybox_lower], SpecParams("u-sc"), runtime="runsc", userns=True)
    assert not runtime.env_dir("u-sc").exists()


def _keys_of(uid: int) -> int:
    """Keys the kernel charges to host `uid` (/proc/key-users; 0 when it has none)."""
    for line in Path("/proc/key-users").read_text().splitlines():
        who, _, rest = line.strip().partition(":")
        if who.strip() == str(uid):
            return int(rest.split()[0])
    return 0


def test_environments_do_not_spend_the_mapped_uids_key_quota(open_runtime, busybox_lower):
    """Every user-namespaced environment's root is host uid 100000: a session keyring per
    container would be charged to that one uid, whose quota (kernel.keys.maxkeys, 200) then
    failed bursts with "unable to create session key: disk quota exceeded". With the seccomp
    profile (keyctl denied) environments get none; without it they still get their own."""
    before = _keys_of(userns.HOST_BASE)
    envs = [_make(open_runtime, busybox_lower) for _ in range(3)]
    try:
        assert all(e.exec("id -u").stdout.strip() == b"0" for e in envs)
        assert _keys_of(userns.HOST_BASE) <= before  # none charged for these three
        assert envs[0].exec("cat /proc/keys").stdout == b""  # masked
        plain_id = f"u-{uuid.uuid4().hex[:10]}"
        plain = open_runtime.create(plain_id, [busybox_lower], SpecParams(plain_id, seccomp=False), userns=True)
        try:
            assert _keys_of(userns.HOST_BASE) >= before + 1  # its own session keyring, as runc does
        finally:
            plain.destroy()
    finally:
        for e in envs:
            e.destroy()
