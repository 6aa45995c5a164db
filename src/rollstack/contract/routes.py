"""The node API's routes, declared once: the server (node/api.py) serves them, the clients
(client/routes.py) call them. docs/interface.md is their prose; a parity test checks the server
serves exactly these (tests/unit/contract/test_contract_parity.py)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True)
class Route:
    method: str
    template: str
    """The path with `{name}` parameters, as FastAPI spells it."""

    def path(self, **params: object) -> str:
        """The path with its parameters filled in (each one path segment, percent-encoded)."""
        return self.template.format(**{k: quote(str(v), safe="") for k, v in params.items()})


ENVS = "/v1/environments"
ENV = f"{ENVS}/{{env_id}}"

HEALTH = Route("GET", "/healthz")
NODE = Route("GET", "/v1/node")
METRICS = Route("GET", "/metrics")
CREATE = Route("POST", ENVS)
LIST = Route("GET", ENVS)
RENEW = Route("POST", "/v1/leases")
RENEW_ONE = Route("POST", f"{ENV}/lease")
INFO = Route("GET", ENV)
DESTROY = Route("DELETE", ENV)
EXEC = Route("POST", f"{ENV}/exec")
EXEC_STREAM = Route("POST", f"{ENV}/exec/stream")
READ_FILE = Route("GET", f"{ENV}/files")
WRITE_FILE = Route("PUT", f"{ENV}/files")
DIFF = Route("GET", f"{ENV}/diff")
FORK = Route("POST", f"{ENV}/fork")
PAUSE = Route("POST", f"{ENV}/pause")
RESUME = Route("POST", f"{ENV}/resume")
SNAPSHOT = Route("POST", f"{ENV}/snapshot")
NETWORK = Route("PUT", f"{ENV}/network")
SNAPSHOTS = Route("GET", "/v1/snapshots")
"""`?source=ENV_ID` filters."""
DELETE_SNAPSHOT = Route("DELETE", "/v1/snapshots")
"""`?name=NAME:TAG` (a query parameter: names hold slashes)."""
VOLUMES = Route("GET", "/v1/volumes")
CREATE_VOLUME = Route("POST", "/v1/volumes")
DELETE_VOLUME = Route("DELETE", "/v1/volumes/{name}")
READ_VOLUME_FILE = Route("GET", "/v1/volumes/{name}/files")
WRITE_VOLUME_FILE = Route("PUT", "/v1/volumes/{name}/files")
EVALUATE = Route("POST", f"{ENV}/evaluate")
STATS = Route("GET", f"{ENV}/stats")
PORT = f"{ENV}/ports/{{port}}/{{path:path}}"
"""An exposed port, proxied (any method: not an operation of its own)."""

ALL: tuple[Route, ...] = (HEALTH, NODE, METRICS, CREATE, LIST, RENEW, RENEW_ONE, INFO, DESTROY, EXEC,
                          EXEC_STREAM, READ_FILE, WRITE_FILE, DIFF, EVALUATE, STATS, FORK, PAUSE,
                          RESUME, SNAPSHOT, SNAPSHOTS, DELETE_SNAPSHOT, NETWORK, VOLUMES, CREATE_VOLUME,
                          DELETE_VOLUME, READ_VOLUME_FILE, WRITE_VOLUME_FILE)
