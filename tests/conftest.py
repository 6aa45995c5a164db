"""Shared fixtures for every test package (keep small and generic).

- `need()`, `require_tool()`, `require_root()` (tests/components.py): what a test needs from the
  machine; a test skips, with the reason, on a developer's machine and FAILS in CI (env `CI` set).
  Marking a test `integration` requires root.
- `registry` (session): a started `RegistryServer` on a free loopback port; `.url`. Always stopped.
- `registry_store`: a `RegistryStore` on it (fresh client per test; counters in `.stats`).
- `oci_store`: an `OciLayoutStore` in `tmp_path`.
- `store`: parametrized, runs the test against BOTH stores (ids `oci` and `registry`).
- `unique_repo`: a repository name no other test uses (the session registry is shared).
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from components import need, require_root
from rollstack.store.server import DEFAULT_BINARY


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("integration") is not None:
        require_root()


@pytest.fixture
def as_root() -> None:
    """For tests that need root but no other component: `pytest.mark.usefixtures("as_root")`."""
    require_root()


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory):
    """A real docker-registry for the whole session (stopped at the end, even on failure)."""
    from rollstack.store.server import RegistryServer

    need(os.access(DEFAULT_BINARY, os.X_OK), f"{DEFAULT_BINARY} (Debian package docker-registry)")
    root = tmp_path_factory.mktemp("registry")
    server = RegistryServer(root, die_with_parent=True)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def registry_store(registry):
    from rollstack.store.registry import RegistryStore

    store = RegistryStore(registry.url, timeout=10.0)
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def oci_store(tmp_path: Path):
    from rollstack.store.ocilayout import OciLayoutStore

    store = OciLayoutStore(tmp_path / "oci-store")
    try:
        yield store
    finally:
        store.close()


@pytest.fixture(params=["oci", "registry"])
def store(request: pytest.FixtureRequest):
    """Each test using this runs twice: on an OCI layout and on the real registry."""
    if request.param == "registry":
        require_root()  # the registry variant is an integration test
    return request.getfixturevalue(f"{request.param}_store")


@pytest.fixture
def unique_repo() -> str:
    return f"test/{uuid.uuid4().hex[:12]}"
