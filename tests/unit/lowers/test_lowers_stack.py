"""`lowers.stack.Lowers`: the per-layer choice (local copy > EROFS mount > FUSE dir), and
`NodeConfig.lowers` (with the flat keys of configs written before it)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from rollstack.lowers.config import LowersConfig
from rollstack.lowers.stack import Lowers, flatten
from rollstack.node.config import NodeConfig


class FakeLazy:
    mountpoint = Path("/lazy/mnt")
    process = None

    def layer_dir(self, digest: str) -> Path:
        return self.mountpoint / "layers" / digest


class FakeErofs:
    def __init__(self, ready: dict[str, Path], published: bool = False) -> None:
        self.ready, self._published, self.requests, self.ensured = ready, published, [], []
        self.lazy = None

    def request(self, refs):
        self.requests.append([r.digest for r in refs])
        return {r.digest for r in refs if r.digest not in self.ready}

    def published(self, refs) -> bool:
        return self._published

    def ensure(self, refs, timeout: float) -> bool:
        self.ensured.append(([r.digest for r in refs], timeout))
        return True

    def lower_for(self, digest: str) -> Path | None:
        return self.ready.get(digest)

    def stats(self):
        return {"mounted": len(self.ready), "nested": {"a-b": 2}}

    def stop(self) -> None:
        self.stopped = True


class FakeMaterializer(FakeErofs):
    def used(self, refs) -> None:
        self.requests.append([r.digest for r in refs])


def refs(*digests: str) -> list:
    return [SimpleNamespace(digest=d) for d in digests]


def test_each_layer_gets_its_fastest_lower_top_first() -> None:
    lowers = Lowers(LowersConfig(erofs_wait=0), FakeLazy())
    lowers.materializer = FakeMaterializer({"a": Path("/layers/a")})
    lowers.erofs = FakeErofs({"a": Path("/erofs/a"), "b": Path("/erofs/b")})
    got = lowers.prepare(refs("a", "b", "c"))
    assert got == [Path("/lazy/mnt/layers/c"), Path("/erofs/b"), Path("/layers/a")]
    assert lowers.stack(["a", "b", "c"]) == tuple(str(p) for p in got)
    assert not lowers.fast([str(p) for p in got]) and lowers.fast(["/erofs/b", "/layers/a"])


@pytest.mark.parametrize("count, first, published, waits", [
    (1, True, False, False),   # a lone first create keeps its cold start
    (8, True, False, True),    # a group waits for its layers' mounts
    (1, False, False, True),   # a sibling of the wave that started the build
    (1, True, True, True),     # images only need fetching
])
def test_a_create_waits_for_erofs_only_when_the_rule_says(count: int, first: bool, published: bool,
                                                           waits: bool) -> None:
    lowers = Lowers(LowersConfig(erofs_wait=2.0), FakeLazy())
    lowers.erofs = FakeErofs({} if first else {"a": Path("/erofs/a")}, published=published)
    lowers.prepare(refs("a"), count)
    assert bool(lowers.erofs.ensured) == waits
    assert lowers.erofs.ensured in ([], [(["a"], 2.0)])


def test_without_faster_forms_every_layer_is_its_fuse_dir_and_stop_is_idempotent() -> None:
    lowers = Lowers(LowersConfig(), FakeLazy())
    assert lowers.prepare(refs("x")) == [Path("/lazy/mnt/layers/x")]
    lowers.used(refs("x"))  # no materializer: nothing to count
    erofs = lowers.erofs = FakeErofs({})
    lowers.stop()
    lowers.stop()
    assert erofs.stopped and lowers.erofs is None


def test_metrics_are_flat_names() -> None:
    lowers = Lowers(LowersConfig(), FakeLazy())
    lowers.erofs = FakeErofs({"a": Path("/erofs/a")})
    assert lowers.metrics() == {"erofs_mounted": 1.0, "erofs_nested_a_b": 2.0, "background_holds_total": 0.0,
                                "background_stops_total": 0.0, "background_expired_total": 0.0}
    assert flatten({"x": True, "y": "s", "z": 1}, "p") == {"p_z": 1.0}


def test_node_config_nests_the_flat_keys_of_older_configs() -> None:
    cfg = NodeConfig.model_validate({"materialize_after": 0, "erofs_lowers": False, "erofs_wait": 5,
                                     "lowers": {"materialize_cpu": 0.5}})
    assert cfg.lowers == LowersConfig(materialize_after=0, erofs=False, erofs_wait=5, materialize_cpu=0.5)
    assert NodeConfig().lowers == LowersConfig()
    assert NodeConfig(lowers={"erofs": False}).lowers.erofs is False
    with pytest.raises(ValidationError):
        NodeConfig(lowers={"erofs_lowers": False})  # inside the section, only its own names
    round_trip = NodeConfig.model_validate_json(cfg.model_dump_json())
    assert round_trip == cfg
