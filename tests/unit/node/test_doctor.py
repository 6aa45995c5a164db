"""`rollstack.node.doctor`'s pure parts: facts -> findings, the report, agent command lines,
FUSE connection names, the bounded runner; and the CLI on roots with nothing in them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rollstack.cli.main import main
from rollstack.host import mountinfo
from rollstack.node.doctor import (
    Finding,
    FixResult,
    RootFacts,
    agent_root,
    bounded,
    connection_id,
    findings,
    report,
    under,
)

R = "/var/lib/rollstack"


def test_running_agent_is_one_unfixable_finding_and_hides_the_rest() -> None:
    facts = RootFacts(R, state="running", agent_pid=42, agent_url="http://127.0.0.1:7878",
                      daemons=[7], envs=["e1"], mounts=[(f"{R}/lazy/mnt", "fuse.rollstack")])
    [f] = findings(facts)
    assert (f.kind, f.target, f.fixable) == ("agent", "42", False)
    assert "rollstack node stop --root" in f.detail


def test_stopped_root_lists_everything_in_reclaim_order() -> None:
    facts = RootFacts(R, state="stopped", stale_pid_file=True, daemons=[11], holders=[12],
                      mounts=[(f"{R}/lazy/mnt", "fuse.rollstack"), (f"{R}/envs/e1/rootfs", "overlay")],
                      fuse={f"{R}/lazy/mnt": "ok"}, containers=["e1"], envs=["e1"],
                      cgroups=["/sys/fs/cgroup/memory/rollstack/e1"], slots={3: f"{R}:e1"}, records=["e1.json"],
                      forks=["f0123456789ab"])
    kinds = [f.kind for f in findings(facts)]
    assert kinds == ["container", "environment", "cgroup", "daemon", "holder", "netns", "mount", "mount",
                     "record", "fork", "file"]
    mounts = [f.target for f in findings(facts) if f.kind == "mount"]
    assert mounts == [f"{R}/envs/e1/rootfs", f"{R}/lazy/mnt"]  # last mounted first
    assert all(f.fixable and f.root == R for f in findings(facts))
    assert [f.target for f in findings(facts) if f.kind == "netns"] == ["rsn-3"]


@pytest.mark.parametrize("status,daemons,reported", [
    ("ok", [5], False),  # a daemon serves it: the mount is listed, the connection is fine
    ("ok", [], True),  # no daemon (a holder keeps it): no successor will come
    ("dead", [5], True),
    ("hung", [5], True),
])
def test_fuse_connection_reported_when_its_daemon_is_gone_or_it_does_not_answer(status, daemons, reported) -> None:
    mp = f"{R}/lazy/mnt"
    facts = RootFacts(R, state="stopped", daemons=daemons, mounts=[(mp, "fuse.rollstack")], fuse={mp: status})
    assert any(f.kind == "fuse" and f.target == mp for f in findings(facts)) is reported


def test_clean_and_absent_roots_have_no_findings() -> None:
    assert findings(RootFacts(R)) == []
    assert findings(RootFacts(R, state="stopped")) == []


def test_timeouts_are_unfixable_findings() -> None:
    [f] = findings(RootFacts(R, timeouts=[f"scan of {R}"]))
    assert (f.kind, f.fixable) == ("timeout", False)


def test_report_is_clean_only_when_nothing_is_left() -> None:
    facts = [RootFacts(R, state="stopped")]
    left = Finding("mount", R, f"{R}/x", "overlay mount")
    assert report(facts, [])["clean"]
    assert not report(facts, [left])["clean"]
    fixed = [FixResult("mount", R, f"{R}/x", True)]
    doc = report(facts, [left], fixed, remaining=[])
    assert doc["clean"] and doc["remaining"] == [] and doc["fixed"][0]["ok"]
    assert json.loads(json.dumps(doc))["findings"][0] == {"kind": "mount", "root": R, "target": f"{R}/x",
                                                          "detail": "overlay mount", "fixable": True}
    assert doc["roots"] == [{"path": R, "state": "stopped", "pid": None, "url": None}]


def test_agent_root_from_its_command_line() -> None:
    cfg = json.dumps({"root": "/srv/node", "listen": "127.0.0.1:1"}).encode()
    argv = [b"/usr/bin/python3", b"-m", b"rollstack.node.agent", b"serve", cfg]
    assert agent_root(argv) == "/srv/node"
    assert agent_root([b"python3", b"-m", b"rollstack.node.agent", b"serve", b"{}"]) == R  # NodeConfig's default
    assert agent_root([b"python3", b"-m", b"rollstack.lazystore.daemon", cfg]) is None
    assert agent_root([b"python3", b"-m", b"rollstack.node.agent", b"serve", b"not json"]) is None
    assert agent_root([b"python3", b"-m", b"rollstack.node.agent", b"serve"]) is None


def test_connection_id_is_the_superblock_dev_t() -> None:
    assert connection_id((0, 53)) == 53
    assert connection_id((1, 2)) == (1 << 20) | 2


def test_devices_from_mountinfo_without_touching_the_mounts() -> None:
    text = ("36 25 0:53 / /var/lib/rollstack/lazy/mnt rw,nosuid - fuse.rollstack rollstack rw\n"
            "37 25 0:54 / /tmp/a\\040b rw - overlay overlay rw,lowerdir=/x\n"
            "38 36 0:55 / /var/lib/rollstack/lazy/mnt rw - fuse.rollstack rollstack rw\n")
    devs = mountinfo.devices(text)
    assert devs["/tmp/a b"] == (0, 54)
    assert devs["/var/lib/rollstack/lazy/mnt"] == (0, 55)  # the top of the stack


def test_under_is_by_path_component() -> None:
    assert under("/srv/node/envs/x", "/srv/node")
    assert not under("/srv/node2/envs/x", "/srv/node")
    assert not under("/srv/node", "/srv/node")


def test_bounded_returns_raises_or_gives_up() -> None:
    assert bounded(lambda: 3, 1.0) == (True, 3)
    with pytest.raises(ZeroDivisionError):
        bounded(lambda: 1 / 0, 1.0)
    t = time.monotonic()
    assert bounded(lambda: time.sleep(5), 0.1) == (False, None)
    assert time.monotonic() - t < 2


def test_only_node_roots_are_doctored(tmp_path: Path, capsys) -> None:
    from rollstack.node.doctor import is_node_root, scan

    assert not is_node_root("/")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "data.txt").write_text("x")
    (tmp_path / "node" / "envs").mkdir(parents=True)
    assert is_node_root(str(tmp_path / "node")) and not is_node_root(str(tmp_path / "other"))
    facts, found = scan(["/", tmp_path / "other"])
    assert [f.state for f in facts] == ["foreign", "foreign"] and found == []


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_json_on_empty_and_missing_roots(tmp_path: Path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    code, out, _ = run(capsys, "node", "doctor", "--root", str(tmp_path / "empty"),
                       "--root", str(tmp_path / "missing"), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["clean"] and doc["findings"] == [] and doc["fixed"] == []
    assert [r["state"] for r in doc["roots"]] == ["stopped", "absent"]
    assert list((tmp_path / "empty").iterdir()) == []  # a scan creates nothing
    code, out, _ = run(capsys, "node", "doctor", "--root", str(tmp_path / "empty"), "--fix")
    assert code == 0 and "doctor: clean" in out


def test_cli_error_is_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("x")
    code, out, err = run(capsys, "node", "doctor", "--root", str(tmp_path / "file"), "--json")
    assert code == 1 and out == ""
    assert err.startswith("error: invalid_request: ") and err.count("\n") == 1
