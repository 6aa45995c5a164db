"""rollstack.run.handle: meta.json as the handle that writes it keeps it (no read-back)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from rollstack.run.handle import Environment


def _env(tmp_path: Path) -> Environment:
    runtime = SimpleNamespace(env_dir=lambda i: tmp_path / i)
    (tmp_path / "e1").mkdir()
    return Environment(runtime, "e1")  # type: ignore[arg-type]


def test_exec_defaults_come_from_the_write_not_a_read_back(tmp_path):
    env = _env(tmp_path)
    env._write_meta({"id": "e1", "runtime": "runc", "lowers": ["/l"]})
    env.set_exec_defaults("/work", {"A": "1"})
    on_disk = json.loads(env.meta_path.read_text())
    assert on_disk == {"id": "e1", "runtime": "runc", "lowers": ["/l"], "exec_cwd": "/work", "exec_env": {"A": "1"}}
    env.meta_path.write_text("{}")  # what the handle wrote is what it uses
    assert env._exec_info() == ("runc", "/work", {"A": "1"}, False)
    assert env.meta()["exec_cwd"] == "/work"


def test_a_new_handle_reads_meta_json(tmp_path):
    first = _env(tmp_path)
    first._write_meta({"id": "e1", "runtime": "runsc", "exec_cwd": "/x"})
    other = Environment(first.runtime, "e1")
    assert other._exec_info() == ("runsc", "/x", {}, False)
    mutated = other.meta()
    mutated["exec_cwd"] = "/elsewhere"  # a copy: the handle's document is not changed
    assert first.meta()["exec_cwd"] == "/x"


def test_an_agent_moved_into_the_environment_is_read_from_meta_json(tmp_path):
    first = _env(tmp_path)
    first._write_meta({"id": "e1", "runtime": "runc", "agent": "netns"})  # by a checkpoint
    assert first._exec_info()[3] and Environment(first.runtime, "e1")._exec_info()[3]
    first._write_meta({"id": "e1", "runtime": "runc", "agent": "runc"})  # it could not listen there
    assert not first._exec_info()[3]
