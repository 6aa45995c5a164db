"""User namespaces (opt-in): root inside is host uid 100000, layers keep their owners inside."""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

import pytest

from rollstack.bench.netlab import Upstream
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


def test_unreachable_root_is_a_clear_error_and_creates_nothing(runtime, busybox_lower):
    # pytest's tmp dirs are 0700: the mapped root could not reach the environment's root
    with pytest.raises(RuntimeFailure, match=r"^security.userns: .* not searchable"):
        runtime.create("u-closed", [busybox_lower], SpecParams("u-closed"), userns=True)
    assert not runtime.env_dir("u-closed").exists()
