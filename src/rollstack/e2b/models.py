"""Wire bodies of the E2B control plane (`/sandboxes`, `/v2/sandboxes`) and of envd's `/files`.

Field names are E2B's (camelCase, `templateID`, `sandboxID` ...), read from the `e2b` SDK's
generated API client (`e2b.api.client.models`). Requests accept and ignore the fields rollstack
has no use for (auto-pause, network, volume mounts ...: see docs/e2b.md), so a newer SDK that
sends more still works; answers carry every field the SDK requires.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollstack.errors import InvalidRequest

ENVD_VERSION = "0.5.7"
"""The envd version we answer as: stdin control (0.3.0), default user (0.4.0), CloseStdin
(0.5.2), octet-stream uploads (0.5.7); not file metadata (0.6.2) nor watch entries (0.6.3)."""

CLIENT_ID = "rollstack"
DEFAULT_TIMEOUT = 15
"""Seconds a sandbox lives when the create request names no timeout (E2B's default)."""
MAX_TIMEOUT = 7 * 24 * 3600


class _In(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class _Out(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


UNHONOURED_CREATE = {
    "mcp": "MCP gateways are not supported",
    "iam": "IAM credentials are not supported",
}
"""E2B create fields that would change what a sandbox is: refused (422 naming the field) unless
absent or empty/false, so a client never believes it got what it asked for."""


ALL_TRAFFIC = "0.0.0.0/0"


def egress_policy(allow_internet_access: bool | None, network: dict[str, Any] | None) -> Any:
    """E2B's egress options as a rollstack plan `network` (rollstack.plan.network), or None
    (neither given: the template plan's). E2B: what `allowOut` names is allowed even where
    `denyOut` denies; without `denyOut` everything is; `allow_internet_access=False` is
    `denyOut: [0.0.0.0/0]`. Taken: `denyOut` empty or everything (anything narrower would need
    a deny list, refused by name), `allowOut` entries as `network.allow` takes them (an
    address, CIDR or name, optionally `:PORT`)."""
    if allow_internet_access is None and network is None:
        return None
    rest = dict(network or {})
    rest.pop("allowPublicTraffic", None)  # about public URLs' auth: a node serves none, either way holds
    allow = list(rest.pop("allowOut", None) or [])
    deny = list(rest.pop("denyOut", None) or [])
    for key in sorted(rest):
        if rest[key] not in (None, [], {}):
            raise ValueError(f"network.{key}: not supported (rollstack takes allowOut, and denyOut {ALL_TRAFFIC})")
    if allow_internet_access is False:
        deny.append(ALL_TRAFFIC)
    if not deny:
        return "outbound"
    if any(d != ALL_TRAFFIC for d in deny):
        raise ValueError(f"network.denyOut: only {ALL_TRAFFIC} (everything but allowOut) is supported, not {deny}")
    return {"allow": allow} if allow else "none"


class NetworkUpdate(_In):
    """`PUT /sandboxes/{id}/network` (`update_network`): the egress configuration, replaced whole."""

    allow_internet_access: bool | None = None
    allow_out: list[str] | None = Field(None, alias="allowOut")
    deny_out: list[str] | None = Field(None, alias="denyOut")
    dns_servers: list[str] | None = Field(None, alias="dnsServers")
    egress_proxy: dict[str, Any] | None = Field(None, alias="egressProxy")
    rules: dict[str, Any] | None = None

    def policy(self) -> Any:
        """The plan `network` it makes (nothing given: everything allowed, E2B's default)."""
        try:
            return egress_policy(self.allow_internet_access, {
                "allowOut": self.allow_out, "denyOut": self.deny_out, "dnsServers": self.dns_servers,
                "egressProxy": self.egress_proxy, "rules": self.rules}) or "outbound"
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None


class AutoResume(_In):
    """`lifecycle={"auto_resume": True}`: envd traffic to the paused sandbox resumes it."""

    enabled: bool = False


class VolumeMountIn(_In):
    """One of `volumeMounts`: the node volume `name` (rollstack.node.volumes) at `path`."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=63)
    path: str = Field(min_length=2, max_length=4096)


class NewVolume(_In):
    """`POST /volumes` (`Volume.create`)."""

    name: str = Field(min_length=1, max_length=63)


class NewSandbox(_In):
    """`POST /v2/sandboxes` and `POST /sandboxes`."""

    template_id: str = Field(alias="templateID", min_length=1, max_length=512)
    timeout: int = Field(DEFAULT_TIMEOUT, ge=1, le=MAX_TIMEOUT)
    metadata: dict[str, str] = Field(default_factory=dict)
    env_vars: dict[str, str] = Field(default_factory=dict, alias="envVars")
    auto_pause: bool = Field(False, alias="autoPause")
    """`lifecycle={"on_timeout": "pause"}`: paused, not killed, at the timeout."""
    auto_pause_memory: bool = Field(True, alias="autoPauseMemory")
    """Taken either way: a rollstack pause always keeps the processes (frozen in place)."""
    auto_resume: AutoResume | None = Field(None, alias="autoResume")
    allow_internet_access: bool | None = None
    network: dict[str, Any] | None = None
    volume_mounts: list[VolumeMountIn] = Field(default_factory=list, alias="volumeMounts", max_length=16)
    """Shared read-write mounts of node volumes (E2B has no read-only flag)."""
    network_policy: Any = Field(None, exclude=True)
    """The plan `network` these egress options make (None: the template plan's): `egress_policy`."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_what_is_not_honoured(cls, data: Any) -> Any:
        """E2B create fields rollstack does not honour are refused by name, never ignored."""
        if isinstance(data, dict):
            for key, why in UNHONOURED_CREATE.items():
                value = data.get(key)
                if value is not None and value is not False and value != [] and value != {}:
                    raise ValueError(f"{key}: {why}")
            resume = data.get("autoResume")
            if isinstance(resume, dict) and resume.get("enabled") and not data.get("autoPause"):
                raise ValueError("autoResume: needs autoPause (lifecycle on_timeout 'pause')")
        return data

    @model_validator(mode="after")
    def _egress(self) -> "NewSandbox":
        self.network_policy = egress_policy(self.allow_internet_access, self.network)
        return self


class RefreshRequest(_In):
    """`POST /sandboxes/{id}/refreshes`: keep the sandbox alive at least `duration` s more."""

    duration: int = Field(DEFAULT_TIMEOUT, ge=0, le=3600)


class TimeoutRequest(_In):
    """`POST /sandboxes/{id}/timeout`: seconds from now."""

    timeout: int = Field(ge=1, le=MAX_TIMEOUT)


class ConnectRequest(_In):
    """`POST /v2/sandboxes/{id}/connect`: an optional new timeout (seconds from now)."""

    timeout: int | None = Field(None, ge=1, le=MAX_TIMEOUT)


class ForkSandboxes(_In):
    """`POST /sandboxes/{id}/fork`: how many (E2B allows 1..20) and their timeout in seconds."""

    count: int = Field(1, ge=1, le=20)
    timeout: int = Field(300, ge=1, le=MAX_TIMEOUT)


class SnapshotSandbox(_In):
    """`POST /sandboxes/{id}/snapshots` (`create_snapshot`): a template name (a tag is made when
    it has none) and whether memory is kept (`mode="full"`): rollstack's are filesystem-only."""

    name: str | None = Field(None, min_length=1, max_length=200)
    memory: bool | None = None


class CreatedSandbox(_Out):
    template_id: str = Field(alias="templateID")
    sandbox_id: str = Field(alias="sandboxID")
    client_id: str = Field(CLIENT_ID, alias="clientID")
    envd_version: str = Field(ENVD_VERSION, alias="envdVersion")
    envd_access_token: str | None = Field(None, alias="envdAccessToken")
    alias: str | None = None


class ListedSandbox(_Out):
    template_id: str = Field(alias="templateID")
    alias: str | None = None
    sandbox_id: str = Field(alias="sandboxID")
    client_id: str = Field(CLIENT_ID, alias="clientID")
    started_at: datetime = Field(alias="startedAt")
    end_at: datetime = Field(alias="endAt")
    cpu_count: int = Field(alias="cpuCount")
    memory_mb: int = Field(alias="memoryMB")
    disk_size_mb: int = Field(0, alias="diskSizeMB")
    state: str = "running"
    envd_version: str = Field(ENVD_VERSION, alias="envdVersion")
    metadata: dict[str, str] = Field(default_factory=dict)
    volume_mounts: list[dict[str, str]] = Field(default_factory=list, alias="volumeMounts")


class SandboxDetail(ListedSandbox):
    envd_access_token: str | None = Field(None, alias="envdAccessToken")


class E2BError(_Out):
    """E2B's error body: the HTTP status again as `code`, and a message."""

    code: int
    message: str


class WrittenFile(_Out):
    """One entry of the `POST /files` answer."""

    name: str
    type: str = "file"
    path: str
