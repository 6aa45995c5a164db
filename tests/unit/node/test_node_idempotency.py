"""`IdempotencyKeys` (node/idempotency.py) and the lease bookkeeping of `EnvRecord`: pure parts."""

from __future__ import annotations

import threading
import time

import pytest

from rollstack.errors import IdempotencyConflict, InvalidRequest
from rollstack.node import record as st
from rollstack.node.idempotency import IdempotencyKeys, check_key, fingerprint
from rollstack.node.record import EnvRecord
from rollstack.plan.model import load_plan

PLAN = {"name": "t", "groups": ["os/base:1"]}


def test_same_key_same_answer_and_a_different_request_conflicts() -> None:
    keys = IdempotencyKeys(ttl=60)
    calls = []
    fp = fingerprint(PLAN, None, None)
    assert keys.run("k1", fp, lambda: calls.append(1) or "e1") == "e1"
    assert keys.run("k1", fp, lambda: calls.append(1) or "e2") == "e1"
    assert calls == [1]
    with pytest.raises(IdempotencyConflict) as err:
        keys.run("k1", fingerprint({**PLAN, "name": "other"}, None, None), lambda: "e3")
    assert err.value.status == 409 and isinstance(err.value, InvalidRequest)
    assert fingerprint(PLAN, 2, None) != fp and fingerprint(PLAN, None, 60.0) != fp


def test_a_concurrent_retry_waits_for_the_first_create() -> None:
    keys = IdempotencyKeys(ttl=60)
    started, release = threading.Event(), threading.Event()
    calls = []

    def slow() -> str:
        calls.append(1)
        started.set()
        release.wait(10)
        return "e1"

    out: list[str] = []
    first = threading.Thread(target=lambda: out.append(keys.run("k", "fp", slow)))
    first.start()
    assert started.wait(10)
    second = threading.Thread(target=lambda: out.append(keys.run("k", "fp", slow)))
    second.start()
    time.sleep(0.05)
    release.set()
    first.join(10)
    second.join(10)
    assert out == ["e1", "e1"] and calls == [1]


def test_a_failed_create_is_forgotten() -> None:
    keys = IdempotencyKeys(ttl=60)

    def boom() -> str:
        raise RuntimeError("transient")

    with pytest.raises(RuntimeError):
        keys.run("k", "fp", boom)
    assert len(keys) == 0
    assert keys.run("k", "fp", lambda: "e2") == "e2"


def test_keys_expire_after_the_ttl_and_the_count_is_bounded() -> None:
    keys = IdempotencyKeys(ttl=0.01)
    assert keys.run("k", "fp", lambda: "e1") == "e1"
    time.sleep(0.05)
    assert keys.run("k", "other", lambda: "e2") == "e2"  # expired: a new request
    small = IdempotencyKeys(ttl=60, max_keys=3)
    for i in range(10):
        small.run(f"k{i}", "fp", lambda i=i: i)
    assert len(small) <= 3
    assert small.run("k9", "fp", lambda: -1) == 9  # the newest are kept


@pytest.mark.parametrize("key", ["", "a b", "x" * 256, "é"])
def test_bad_keys_are_invalid_requests(key: str) -> None:
    with pytest.raises(InvalidRequest):
        check_key(key)
    assert check_key("a-b_c:1/2") == "a-b_c:1/2"


def test_a_lease_runs_from_each_renewal_and_only_when_set() -> None:
    rec = EnvRecord(id="e1", plan=load_plan(PLAN), timeout=100)
    rec.renew()
    assert rec.lease_until is None and not rec.lapsed(time.monotonic() + 1e6)
    rec.renew(0.5)
    assert rec.lease == 0.5 and not rec.lapsed(time.monotonic())
    assert rec.lapsed(time.monotonic() + 1)
    info = rec.info()
    assert info.lease == 0.5 and 0 < info.lease_remaining <= 0.5
    doc = rec.recovery_doc()
    assert doc["lease"] == 0.5 and "destroying" not in doc
    rec.state = st.DESTROYING
    assert rec.recovery_doc()["destroying"] is True
