"""`rollstack bench convert --src` runs end to end on a small tree and reports every figure."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rollstack.cli.main import main

pytestmark = pytest.mark.integration


def test_bench_convert_small_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    for i in range(40):
        d = src / f"pkg{i % 5}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"mod{i}.py").write_text(f"def f{i}():\n    return {i}\n" * (50 + i))
    (src / "blob.bin").write_bytes(os.urandom(300_000))
    rc = main(["bench", "convert", "--src", str(src), "--levels", "3,1", "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    doc = json.loads(out)
    assert doc["files"] == 41 and doc["payload_bytes"] > 300_000
    assert doc["blob_size"] > 0 and doc["tar_gz_size"] > 0
    assert doc["toc_size"] < 65536
    assert doc["open"]["tail_64k"]["requests"] == 1 and doc["open"]["default_tail"]["requests"] == 1
    assert [lv["level"] for lv in doc["levels"]] == [3, 1]
    assert doc["targets"]["open_one_request_if_toc_lt_64k"] is True
    assert doc["command"].startswith("rollstack bench convert --src")
