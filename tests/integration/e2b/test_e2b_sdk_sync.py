"""The unmodified `e2b` SDK (sync) against a real node: sandboxes from a published template,
commands (foreground, background, stdin, signals), files, timeouts, listing, kill."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.integration

from e2b import (  # noqa: E402
    CommandExitException, FileNotFoundException, NotFoundException, Sandbox, SandboxException,
)


def test_create_run_and_kill(e2b_node):
    sbx = Sandbox.create(e2b_node.template, timeout=120)
    try:
        assert sbx.sandbox_id.startswith("e")
        r = sbx.commands.run("echo hello; echo oops >&2; cat /work/app/hello.txt")
        assert r.exit_code == 0
        assert r.stdout == "hello\nbug\n"  # the template's mutation was applied
        assert r.stderr == "oops\n"
    finally:
        sbx.kill()
