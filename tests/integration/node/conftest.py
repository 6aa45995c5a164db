"""Fixtures of the node integration tests (helpers: node_helpers.py).

- `corpus` (module): the busybox corpus published into a fresh OCI layout store; its spec.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from components import need, require_tool
from node_helpers import publish_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> str:
    require_tool("runc", "fusermount3")
    need(Path("/bin/busybox").exists(), "busybox-static (/bin/busybox)")
    work = tmp_path_factory.mktemp("node-corpus")
    return publish_corpus(work / "store", work / "build")
