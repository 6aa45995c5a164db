"""`rollstack bench import` end to end on a small image packed by the benchmark's own packer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rollstack_bench.import_image import write_layout
from rollstack_bench.imports import run

pytestmark = pytest.mark.integration


def _rootfs(root: Path) -> Path:
    for i in range(40):
        d = root / f"usr/lib/pkg{i % 5}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"m{i}.py").write_bytes(os.urandom(20_000) if i % 3 else b"x = 1\n" * 5000)
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/tool").write_bytes(b"#!/bin/sh\n")
    (root / "usr/bin/tool").chmod(0o755)
    os.link(root / "usr/bin/tool", root / "usr/bin/tool2")
    (root / "usr/bin/sh").symlink_to("tool")
    return root


def test_bench_import_reports_cold_serial_registry_and_reimport(tmp_path: Path, registry):
    rootfs = _rootfs(tmp_path / "rootfs")
    sizes = write_layout(rootfs, tmp_path / "layout", tag="t")
    index = json.loads((tmp_path / "layout/index.json").read_text())
    assert index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == "t"
    assert sizes["unpacked_bytes"] > sizes["layer_bytes"] > 0

    doc = run(f"oci:{tmp_path / 'layout'}:t", tmp_path / "work", registry=True, serial=True)
    cold = doc["cold"]
    assert cold["converted"] == 1 and cold["transfer"] == "layout" and cold["manifest_written"]
    assert cold["payload_bytes"] == sum(p.stat().st_size for p in rootfs.rglob("*") if p.is_file() and not p.is_symlink()) \
        - (rootfs / "usr/bin/tool2").stat().st_size  # a hardlink's bytes count once
    assert cold["mb_per_s"] > 0 and cold["cpu_seconds"] >= 0 and doc["verify"] == {"blobs": 1, "ok": True}
    assert doc["serial"]["same_blobs"] is True
    assert doc["registry"]["transfer"] == "registry-stream" and doc["registry"]["layers"] == cold["layers"]
    again = doc["reimport"]
    assert (again["converted"], again["cached"], again["uploaded_bytes"]) == (0, 1, 0)
    assert again["digest"] == cold["digest"] and again["manifest_written"]
    assert doc["reimport_new_tag"]["converted"] == 0 and doc["reimport_new_tag"]["manifest_written"]
