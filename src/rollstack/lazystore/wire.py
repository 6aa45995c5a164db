"""Wire models of the lazy store's control API (lazystore/control.py): the request bodies, shared
by the daemon (validation) and `LazyStoreClient` (construction)."""

from __future__ import annotations

from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

Key = Annotated[str, StringConstraints(min_length=1, max_length=1024)]
"""A trace key: a non-empty string of at most 1024 characters."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class LayerRef(_Body):
    repo: str
    digest: str
    """`sha256:<64 hex>` (checked when the layer is added)."""


class LayersBody(_Body):
    """POST /v1/layers"""

    layers: list[LayerRef]


class FetchAllBody(LayersBody):
    """POST /v1/fetch_all"""

    background: bool = False


class BeginEnvBody(LayersBody):
    """POST /v1/envs/<id>"""

    trace_key: Optional[Key] = None
    fallback_key: Optional[Key] = None
    background: bool = True


MAX_GROUP = 256
"""Most environments one `POST /v1/envs` may begin (the node's `count` limit)."""
EnvId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
"""An environment id as the node makes them (`e<12 hex>`, or a test's own name): no `/`."""


class BeginEnvsBody(BeginEnvBody):
    """POST /v1/envs: begin the environments of one group (same layers and trace keys) at once"""

    ids: Annotated[list[EnvId], Field(min_length=1, max_length=MAX_GROUP)]

    @field_validator("ids")
    @classmethod
    def _unique(cls, ids: list[str]) -> list[str]:
        dup = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) != len(ids) else []
        if dup:
            raise ValueError(f"duplicate environment ids {dup[:5]}")
        return ids


class PrefetchBody(_Body):
    """POST /v1/prefetch"""

    trace_key: Key
    env_id: Optional[str] = None


class ShareTraceBody(_Body):
    """POST /v1/envs/<id>/trace"""

    keys: list[Key] = Field(min_length=1, max_length=4)


class PeersBody(_Body):
    """PUT /v1/peers"""

    urls: list[str]
    self_url: Optional[str] = Field(default=None, alias="self")
