"""`Lowers`: the node's one owner of "layer stack -> ordered lower dirs".

Per layer, the fastest lower the node has (checked at every create, so a layer moves up as soon
as its faster form is ready, and running environments keep the dirs they mounted):

1. its materialized local copy (`materialize.LayerMaterializer`, extracted by `extract`), once
   the layer is hot (`LowersConfig.materialize_after` environments used it);
2. its EROFS mount over the lazy store's blob (`erofs.ErofsLowers`): an image built from the
   layer's TOC on the node, or fetched when published beside the group (plan/lowers.py);
3. the lazy store's FUSE directory of the layer (`LazyStore.layer_dir`).

`prepare` is what a create calls: it starts the EROFS builds of the stack's layers and may wait
for them (`erofs_wait`, a GRPO group or a sibling of a wave), then answers the lowers top first.
`used` counts a create's layers toward materialization. When a layer gets a faster lower,
`on_ready` fires (the warm pool refills on the new dirs). `hold` stops the background
extraction and EROFS builds for a latency-critical block (a fork: host.foreground).
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterable, Sequence

from rollstack.host.foreground import Foreground

from rollstack.lazystore.protocol import LazyStore
from rollstack.lowers.config import LowersConfig
from rollstack.lowers.erofs import ErofsLowers
from rollstack.lowers.materialize import LayerMaterializer
from rollstack.plan.resolve import LayerRef

log = logging.getLogger(__name__)


class Lowers:
    def __init__(self, config: LowersConfig, lazy: LazyStore) -> None:
        self.config = config
        self.lazy = lazy
        self.materializer: LayerMaterializer | None = None
        self.erofs: ErofsLowers | None = None
        self.foreground = Foreground()

    @classmethod
    def start(cls, config: LowersConfig, lazy: LazyStore, *, layers_dir: Path, erofs_dir: Path,
              tocs_dir: Path, chunk_cache: Path, store: str, cgroup_tag: str,
              fetch_image: Callable[[LayerRef], bytes] | None,
              on_ready: Callable[[], None]) -> "Lowers":
        """Start the materializer and the EROFS worker that `config` asks for (EROFS only where
        the kernel mounts it from files). `fetch_image` reads a published image from the store."""
        from rollstack.lowers import erofs

        self = cls(config, lazy)
        try:
            if config.materialize_after:
                self.materializer = LayerMaterializer(
                    layers_dir, lazy, after=config.materialize_after, budget=config.materialize_budget,
                    min_free=config.materialize_min_free, store=store, chunk_cache=chunk_cache,
                    cpu=config.materialize_cpu, min_idle=config.materialize_min_idle,
                    cgroup_tag=cgroup_tag, on_ready=on_ready, foreground=self.foreground).start()
            if config.erofs and erofs.supported():
                self.erofs = ErofsLowers(
                    erofs_dir, lazy, tocs_dir, on_ready=on_ready, grace=config.erofs_grace,
                    min_idle=config.erofs_min_idle,
                    fetch_image=fetch_image if config.erofs_published else None,
                    foreground=self.foreground).start()
            elif config.erofs:
                log.info("this kernel cannot mount EROFS from files: layers stay on FUSE lowers")
        except BaseException:
            self.stop()
            raise
        return self

    def set_lazy(self, lazy: LazyStore) -> None:
        """A lazy store daemon's successor: layer dirs and blobs are read through it from now."""
        self.lazy = lazy
        for part in (self.materializer, self.erofs):
            if part is not None:
                part.lazy = lazy

    def prepare(self, refs: Sequence[LayerRef], count: int = 1) -> list[Path]:
        """The lowers of a create's stack (`refs` bottom first), top first. The layers' EROFS
        builds start here, as early as possible: the create that asks first for a layer does not
        wait for it (a lone cold start keeps its time); a group (`count` > 1), a create that
        finds the build already under way (a sibling of the same wave), and layers whose images
        only need fetching wait up to `erofs_wait` s, so they run on EROFS lowers from the start."""
        if self.erofs is not None:
            first = self.erofs.request(refs)
            if self.config.erofs_wait > 0 and (count > 1 or not first or self.erofs.published(refs)):
                self.erofs.ensure(refs, self.config.erofs_wait)
        return [self.lower(r.digest) for r in reversed(refs)]

    def lower(self, digest: str) -> Path:
        """The layer's local copy when it has one, else its EROFS mount, else its FUSE directory."""
        local = self.materializer.lower_for(digest) if self.materializer is not None else None
        if local is None and self.erofs is not None:
            local = self.erofs.lower_for(digest)
        return local if local is not None else Path(self.lazy.layer_dir(digest))

    def stack(self, digests: Sequence[str]) -> tuple[str, ...]:
        """The current lowers of layers `digests` (bottom first), top first, as strings."""
        return tuple(str(self.lower(d)) for d in reversed(digests))

    def fast(self, lowers: Sequence[str]) -> bool:
        """None of `lowers` is one of the lazy store's FUSE trees (each is an EROFS mount or a
        local copy): commands on them walk and stat at native speed."""
        fuse = Path(self.lazy.mountpoint)
        return not any(Path(p).is_relative_to(fuse) for p in lowers)

    def local_layers(self) -> set[str]:
        """Digests of the layers materialized on this node (hot for placement)."""
        return self.materializer.ready_digests() if self.materializer is not None else set()

    def used(self, refs: Iterable[LayerRef]) -> None:
        """A create stacked these layers: they count toward materialization."""
        if self.materializer is not None:
            self.materializer.used(refs)

    def metrics(self) -> dict[str, float]:
        """Flat gauges for /metrics: `materialized_*`, `erofs_*`, `background_*_total` (holds,
        stops, stops that ran out: host.foreground)."""
        out = flatten({f"{k}_total": v for k, v in self.foreground.counters.items()}, "background")
        for prefix, part in (("materialized", self.materializer), ("erofs", self.erofs)):
            if part is not None:
                out.update(flatten(part.stats(), prefix))
        return out

    def wait_idle(self, timeout: float) -> bool:
        """True once no EROFS build and no extraction is queued or under way (benchmarks
        settle on it); False after `timeout` s of each."""
        end = time.monotonic() + timeout
        return all(part is None or part.wait_idle(max(0.0, end - time.monotonic()))
                   for part in (self.erofs, self.materializer))

    def hold(self) -> ContextManager[None]:
        """The background extraction and EROFS build stopped for the block (`Foreground.hold`:
        1 s at most in a row); not a build a create waits for."""
        return self.foreground.hold()

    def stop(self) -> None:
        """Continue what a hold stopped, stop the EROFS worker, then the materializer (each
        once; the other still stops if one fails)."""
        self.foreground.close()
        for name in ("erofs", "materializer"):
            part = getattr(self, name)
            if part is None:
                continue
            setattr(self, name, None)
            try:
                part.stop()
            except Exception:  # noqa: BLE001 - keep stopping the rest
                log.exception("stopping the %s failed", name)


def flatten(doc: Any, prefix: str) -> dict[str, float]:
    """A statistics document as flat metric names (`prefix_key_subkey`) -> numbers."""
    out: dict[str, float] = {}
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.update(flatten(v, f"{prefix}_{k}"))
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        out[re.sub(r"[^A-Za-z0-9_]", "_", prefix)] = float(doc)
    return out
