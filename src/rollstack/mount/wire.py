"""Wire models of the lazy store's control API (mount/control.py): the request bodies, shared
by the daemon (validation) and `LazyStoreClient` (construction)."""

from __future__ import annotations

from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

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


class PrefetchBody(_Body):
    """POST /v1/prefetch"""

    trace_key: Key
    env_id: Optional[str] = None


class PeersBody(_Body):
    """PUT /v1/peers"""

    urls: list[str]
    self_url: Optional[str] = Field(default=None, alias="self")
