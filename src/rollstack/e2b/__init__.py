"""An E2B-compatible API on the node agent: the unmodified `e2b` SDK drives rollstack sandboxes.

`E2B_API_URL` and `E2B_SANDBOX_URL` = the node's URL, `E2B_API_KEY` = its token, `templateID` =
a published plan (`rollstack plan publish NAME:TAG PLAN`). Modules: `app` (the dispatcher beside
`/v1`), `control` (REST control plane, `/files`, `/health`), `envd_process` and `envd_fs` (the
Connect services), `processes` (a sandbox's process table), `sandboxes` (the sandbox table),
`models` (wire bodies). See docs/e2b.md for the supported surface.

The envd services run on the Connect stubs and runtime the `e2b` wheel ships (`connectrpc`,
`protobuf`): installed with the `e2b` extra (and `dev`). Without them the node serves `/v1` only.
"""

from __future__ import annotations

import logging
from typing import Any

from rollstack.contract.service import NodeLocal

log = logging.getLogger(__name__)

_DEPENDENCIES = ("e2b", "connectrpc", "protobuf", "pyqwest")


def install(app: Any, service: NodeLocal, token: str | None) -> Any:
    """Serve the E2B API on the node app `app`; None (logged) when the `e2b` extra is missing."""
    try:
        from rollstack.e2b.app import install as _install
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in _DEPENDENCIES:
            raise
        log.warning("E2B-compatible API off: %s (pip install 'rollstack[e2b]')", exc)
        return None
    return _install(app, service, token)


__all__ = ["install"]
