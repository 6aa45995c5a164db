"""The reaper's `on_timeout: pause` (E2B's autoPause), on a service that is not started (its
pause and destroy replaced by recorders): paused once at the end of the lifetime, then kept
`paused_ttl`, then destroyed; a pause that keeps failing ends in a destroy, never a loop, and no
error of one record stops the reaper."""

from __future__ import annotations

import time

from rollstack.node import record as st
from rollstack.node.config import NodeConfig
from rollstack.node.record import EnvRecord
from rollstack.node.service import NodeService
from rollstack.plan.model import load_plan


def _service(tmp_path, monkeypatch, pause):
    svc = NodeService(NodeConfig(root=tmp_path, store=f"oci:{tmp_path / 'store'}", paused_ttl=100))
    rec = EnvRecord(id="e1", plan=load_plan({"name": "t", "groups": ["os/x:1"]}), timeout=0.0,
                    internal=True, state=st.RUNNING, on_timeout="pause")
    svc._envs[rec.id] = rec
    destroyed: list[str] = []
    monkeypatch.setattr(svc, "pause", pause)
    monkeypatch.setattr(svc, "_destroy_quietly", destroyed.append)
    return svc, rec, destroyed


def test_paused_at_the_timeout_then_destroyed_after_paused_ttl(tmp_path, monkeypatch):
    paused: list[str] = []
    svc, rec, destroyed = _service(tmp_path, monkeypatch, paused.append)
    assert svc.reap_expired() == [] and paused == ["e1"] and rec.timeout_paused
    assert rec.deadline > time.monotonic() + 50  # `paused_ttl` more
    svc.reap_expired()
    assert paused == ["e1"] and destroyed == []  # paused once
    rec.timeout = 0.0  # its paused_ttl is over
    assert svc.reap_expired() == ["e1"] and destroyed == ["e1"]


def test_a_pause_that_keeps_failing_ends_in_a_destroy(tmp_path, monkeypatch):
    tries: list[str] = []

    def failing(env_id: str) -> None:
        tries.append(env_id)
        raise OSError("freezer.state: device busy")  # not even a typed error

    svc, rec, destroyed = _service(tmp_path, monkeypatch, failing)
    for _ in range(4):
        assert svc.reap_expired() == []  # retried at the next reaps
    assert svc.reap_expired() == ["e1"] and len(tries) == 5 and destroyed == ["e1"]


def test_only_running_environments_are_paused(tmp_path, monkeypatch):
    paused: list[str] = []
    svc, rec, destroyed = _service(tmp_path, monkeypatch, paused.append)
    rec.state = st.OOM_TERMINATED  # ended for lack of memory: nothing to keep
    assert svc.reap_expired() == ["e1"] and paused == [] and destroyed == ["e1"]
