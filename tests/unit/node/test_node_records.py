"""node.recovery's records: a reserved record tmp is used by the save and never read as a record."""

from __future__ import annotations

import os

from rollstack.host import atomic
from rollstack.node import recovery


def test_a_reserved_record_is_saved_into_its_reserved_inode(tmp_path):
    recovery.reserve_record(tmp_path, "e1")
    tmp = atomic.tmp_of(tmp_path / recovery.RECORDS_DIR / "e1.json")
    ino = os.stat(tmp).st_ino
    assert recovery.load_records(tmp_path) == {}  # a reservation is no record
    recovery.reserve_record(tmp_path, "e1")  # again (a re-keyed sandbox): still one tmp
    recovery.save_record(tmp_path, "e1", {"plan": {"name": "t"}})
    path = tmp_path / recovery.RECORDS_DIR / "e1.json"
    assert os.stat(path).st_ino == ino
    assert recovery.load_records(tmp_path) == {"e1": {"plan": {"name": "t"}}}


def test_drop_removes_the_record_and_an_unused_reservation(tmp_path):
    recovery.save_record(tmp_path, "e1", {"a": 1})
    recovery.reserve_record(tmp_path, "e2")
    recovery.drop_record(tmp_path, "e1")
    recovery.drop_record(tmp_path, "e2")
    assert list((tmp_path / recovery.RECORDS_DIR).iterdir()) == []


def test_loading_clears_leftover_tmps_and_unreadable_records(tmp_path):
    d = tmp_path / recovery.RECORDS_DIR
    recovery.reserve_record(tmp_path, "warm1")  # a crashed node's warm sandbox
    (d / "bad.json").write_text("{not json")
    recovery.save_record(tmp_path, "ok", {"x": 1})
    assert recovery.load_records(tmp_path) == {"ok": {"x": 1}}
    assert sorted(p.name for p in d.iterdir()) == ["ok.json"]
