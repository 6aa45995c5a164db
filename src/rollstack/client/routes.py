"""The node API's calls, once: what each sends and how its answer is decoded (the routes
themselves are the contract's, `rollstack.contract.routes`, which the server serves).

`HttpService` (sync) and `AsyncHttpService` (async) are the same list of calls over two httpx
clients: each method builds a `Call` here and hands it to its transport, so a route, a timeout
or a wire model is never spelled twice.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, TypeVar

import httpx
from pydantic import TypeAdapter

from rollstack.client._base import EXEC_ANSWER_SLACK, request_timeout, transport_error
from rollstack.errors import ExecTimeout, RollstackError, from_dict
from rollstack.contract import models as m
from rollstack.contract import routes as R

T = TypeVar("T")
_JSON = {"content-type": "application/json"}

_SNAPSHOTS = TypeAdapter(list[m.SnapshotInfo])
_VOLUMES = TypeAdapter(list[m.VolumeInfo])


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and the decoder of its successful answer."""

    method: str
    path: str
    decode: Callable[[httpx.Response], T]
    kwargs: dict[str, Any] = field(default_factory=dict)
    """httpx request arguments: json/content/params/headers/timeout."""
    work_timeout: float | None = None
    """An exec's own timeout: the answer is due by then (plus slack), else `ExecTimeout`."""

    def failure(self, exc: httpx.TransportError, url: str) -> RollstackError:
        """The error a transport failure of this call is: a read that outlived an exec's
        timeout and slack is `ExecTimeout` (the node never answered the exec); anything else is
        the node being unavailable."""
        if self.work_timeout is not None and isinstance(exc, httpx.ReadTimeout):
            return ExecTimeout(f"no answer from {url} within the exec's {self.work_timeout} s timeout "
                               f"and {EXEC_ANSWER_SLACK:.0f} s of slack", timeout=self.work_timeout)
        return transport_error(exc, url)


def _none(_: httpx.Response) -> None:
    return None


def _create_kwargs(body: dict[str, Any], lease: float | None, idempotency_key: str | None) -> dict[str, Any]:
    if lease is not None:
        body["lease"] = lease
    kwargs: dict[str, Any] = {"json": body, "timeout": request_timeout(None)}
    if idempotency_key is not None:
        kwargs["headers"] = {m.IDEMPOTENCY_HEADER: idempotency_key}
    return kwargs


def create(plan: dict[str, Any] | str, lease: float | None = None,
           idempotency_key: str | None = None) -> Call[m.CreateResponse]:
    return Call(R.CREATE.method, R.CREATE.path(), lambda r: m.CreateResponse.model_validate_json(r.content),
                _create_kwargs({"plan": plan}, lease, idempotency_key))


def create_many(plan: dict[str, Any] | str, count: int, lease: float | None = None,
                idempotency_key: str | None = None) -> Call[list[m.CreateResponse]]:
    """`count` identical environments in one call (a GRPO group), all or none."""
    return Call(R.CREATE.method, R.CREATE.path(), lambda r: m.CreateGroupResponse.model_validate_json(r.content).environments,
                _create_kwargs({"plan": plan, "count": count}, lease, idempotency_key))


def fork(env_id: str, count: int = 1, lease: float | None = None,
         idempotency_key: str | None = None) -> Call[list[m.CreateResponse]]:
    """`count` children of a running environment (its filesystem now), all or none."""
    return Call(R.FORK.method, R.FORK.path(env_id=env_id),
                lambda r: m.CreateGroupResponse.model_validate_json(r.content).environments,
                _create_kwargs({"count": count}, lease, idempotency_key))


def pause(env_id: str, mode: str = "freeze") -> Call[m.EnvironmentInfo]:
    """`mode`: freeze (in memory) or checkpoint (CRIU, to disk); long for a big environment."""
    return Call(R.PAUSE.method, R.PAUSE.path(env_id=env_id), lambda r: m.EnvironmentInfo.model_validate_json(r.content),
                {"json": {"mode": mode}, "timeout": request_timeout(None)})


def resume(env_id: str) -> Call[m.EnvironmentInfo]:
    return Call(R.RESUME.method, R.RESUME.path(env_id=env_id), lambda r: m.EnvironmentInfo.model_validate_json(r.content),
                {"timeout": request_timeout(None)})


def snapshot(env_id: str, name: str) -> Call[m.Snapshot]:
    return Call(R.SNAPSHOT.method, R.SNAPSHOT.path(env_id=env_id), lambda r: m.Snapshot.model_validate_json(r.content),
                {"json": {"name": name}, "timeout": request_timeout(None)})


def set_network(env_id: str, network: Any) -> Call[m.EnvironmentInfo]:
    return Call(R.NETWORK.method, R.NETWORK.path(env_id=env_id), lambda r: m.EnvironmentInfo.model_validate_json(r.content),
                {"json": {"network": network}})


def snapshots(source: str | None = None) -> Call[list[m.SnapshotInfo]]:
    params = {"source": source} if source is not None else {}
    return Call(R.SNAPSHOTS.method, R.SNAPSHOTS.path(), lambda r: _SNAPSHOTS.validate_json(r.content), {"params": params})


def delete_snapshot(name: str) -> Call[None]:
    return Call(R.DELETE_SNAPSHOT.method, R.DELETE_SNAPSHOT.path(), _none, {"params": {"name": name}})


def create_volume(name: str) -> Call[m.VolumeInfo]:
    return Call(R.CREATE_VOLUME.method, R.CREATE_VOLUME.path(), lambda r: m.VolumeInfo.model_validate_json(r.content), {"json": {"name": name}})


def volumes() -> Call[list[m.VolumeInfo]]:
    return Call(R.VOLUMES.method, R.VOLUMES.path(), lambda r: _VOLUMES.validate_json(r.content))


def delete_volume(name: str) -> Call[None]:
    return Call(R.DELETE_VOLUME.method, R.DELETE_VOLUME.path(name=name), _none)


def read_volume_file(name: str, path: str) -> Call[bytes]:
    return Call(R.READ_VOLUME_FILE.method, R.READ_VOLUME_FILE.path(name=name), lambda r: r.content,
                {"params": {"path": path}})


def write_volume_file(name: str, path: str, data: bytes) -> Call[None]:
    return Call(R.WRITE_VOLUME_FILE.method, R.WRITE_VOLUME_FILE.path(name=name), _none,
                {"params": {"path": path}, "content": data})


def renew(env_ids: list[str], lease: float | None = None) -> Call[m.LeaseRenewal]:
    """Renew many leases in one request (`POST /v1/leases`)."""
    body: dict[str, Any] = {"ids": list(env_ids)}
    if lease is not None:
        body["lease"] = lease
    return Call(R.RENEW.method, R.RENEW.path(), lambda r: m.LeaseRenewal.model_validate_json(r.content), {"json": body})


def renew_one(env_id: str, lease: float | None = None) -> Call[m.LeaseRenewal]:
    """Renew one lease (`EnvironmentNotFound` when it is not live)."""
    return Call(R.RENEW_ONE.method, R.RENEW_ONE.path(env_id=env_id), lambda r: m.LeaseRenewal.model_validate_json(r.content),
                {"json": {} if lease is None else {"lease": lease}})


def list_environments() -> Call[list[m.EnvironmentInfo]]:
    return Call(R.LIST.method, R.LIST.path(), lambda r: m.EnvironmentList.model_validate_json(r.content).environments)


def info(env_id: str) -> Call[m.EnvironmentInfo]:
    return Call(R.INFO.method, R.INFO.path(env_id=env_id), lambda r: m.EnvironmentInfo.model_validate_json(r.content))


def exec_(env_id: str, request: m.ExecRequest) -> Call[m.ExecResult]:
    return Call(R.EXEC.method, R.EXEC.path(env_id=env_id), lambda r: m.ExecResult.model_validate_json(r.content),
                {"content": request.model_dump_json(exclude_none=True), "headers": _JSON,
                 "timeout": request_timeout(request.timeout)}, request.timeout)


def exec_stream(env_id: str, request: m.ExecRequest) -> Call[None]:
    """The streaming exec: the transport reads its answer line by line (`chunk()`)."""
    return Call(R.EXEC_STREAM.method, R.EXEC_STREAM.path(env_id=env_id), _none,
                {"content": request.model_dump_json(exclude_none=True), "headers": _JSON,
                 "timeout": request_timeout(request.timeout)}, request.timeout)


def read_file(env_id: str, path: str) -> Call[bytes]:
    return Call(R.READ_FILE.method, R.READ_FILE.path(env_id=env_id), lambda r: r.content, {"params": {"path": path}})


def write_file(env_id: str, path: str, data: bytes) -> Call[None]:
    return Call(R.WRITE_FILE.method, R.WRITE_FILE.path(env_id=env_id), _none, {"params": {"path": path}, "content": data})


def diff(env_id: str, binary: str = "name") -> Call[str]:
    return Call(R.DIFF.method, R.DIFF.path(env_id=env_id), lambda r: r.text, {"params": {"binary": binary}})


def evaluate(env_id: str) -> Call[m.Evaluation]:
    return Call(R.EVALUATE.method, R.EVALUATE.path(env_id=env_id), lambda r: m.Evaluation.model_validate_json(r.content),
                {"timeout": request_timeout(None)})


def stats(env_id: str) -> Call[m.Stats]:
    return Call(R.STATS.method, R.STATS.path(env_id=env_id), lambda r: m.Stats.model_validate_json(r.content))


def destroy(env_id: str) -> Call[None]:
    return Call(R.DESTROY.method, R.DESTROY.path(env_id=env_id), _none, {"timeout": request_timeout(None)})


def health() -> Call[m.Health]:
    return Call(R.HEALTH.method, R.HEALTH.path(), lambda r: m.Health.model_validate_json(r.content))


def metrics_text() -> Call[str]:
    return Call(R.METRICS.method, R.METRICS.path(), lambda r: r.text)


def metrics() -> Call[dict[str, float]]:
    """The node's own gauges (`rollstack_<name>` on /metrics) as `{name: value}`, the same
    mapping `NodeService.metrics()` returns in-process."""
    return Call(R.METRICS.method, R.METRICS.path(), lambda r: parse_metrics(r.text))


_SAMPLE = re.compile(r"^rollstack_([A-Za-z0-9_:]+)\s+(\S+)(?:\s+\d+)?$")


def parse_metrics(text: str) -> dict[str, float]:
    """`rollstack_<name> <value>` samples of a Prometheus text exposition -> {name: value}
    (samples with labels and other exporters' series, e.g. the API's latency histograms, are
    not the node's gauges and are left out)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m:
            try:
                out[m.group(1)] = float(m.group(2))
            except ValueError:
                continue
    return out


def chunk(line: str) -> m.ExecChunk:
    """One line of a streaming exec; an `error` line raises its typed error."""
    c = m.ExecChunk.model_validate(json.loads(line))
    if c.type == "error":
        raise from_dict(c.error or {"code": "internal_error", "message": "stream failed"})
    return c
