"""`Stages.prepare`'s order over stand-ins: resolve, the layers into the lazy store, then the
caller's `on_layers` (a lone create begins its environment there, so its trace prefetch runs
while the EROFS images are fetched and mounted), then the EROFS request and wait."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from rollstack.node.config import NodeConfig
from rollstack.node.stages import Stages


class _Recorder:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls


class _Resolver(_Recorder):
    def resolve(self, plan):  # noqa: ANN001
        self.calls.append("resolve")
        return SimpleNamespace(layers=[SimpleNamespace(digest="sha256:" + "a" * 64)])


class _Lazy(_Recorder):
    mountpoint = "/lazy"

    def add_layers(self, refs):  # noqa: ANN001
        self.calls.append("add_layers")

    def layer_dir(self, digest: str) -> str:
        return f"/lazy/layers/{digest}"


class _Erofs(_Recorder):
    def request(self, refs):  # noqa: ANN001
        self.calls.append("erofs.request")
        return True

    def published(self, refs) -> bool:  # noqa: ANN001
        return True

    def ensure(self, refs, timeout):  # noqa: ANN001
        self.calls.append("erofs.ensure")

    def lower_for(self, digest: str):
        return Path("/erofs") / digest


def test_on_layers_runs_after_the_layers_are_added_and_before_the_erofs_wait(tmp_path: Path) -> None:
    calls: list[str] = []
    s = Stages(NodeConfig(root=tmp_path))
    s.resolver, s.lazy, s.erofs, s.materializer = _Resolver(calls), _Lazy(calls), _Erofs(calls), None
    plan = SimpleNamespace(fetch=SimpleNamespace(eager=False))
    prepared = s.prepare(plan, on_layers=lambda stack, refs: calls.append(f"on_layers:{len(refs)}"))
    assert calls == ["resolve", "add_layers", "on_layers:1", "erofs.request", "erofs.ensure"]
    assert prepared.lowers == [Path("/erofs") / ("sha256:" + "a" * 64)]
