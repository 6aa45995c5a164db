"""Measure the containerd baselines on a built corpus: cold and warm init over a shaped link.

`measure_baselines()` sets up the whole bench rig (ShapedLink -> NetnsRegistry -> images pushed
-> PrivateContainerd), runs cold inits (every cache cleared, page cache dropped) and warm inits
for each system, and returns one document in the `bench init` shape (`systems.<name>.cold_init_p50`
...) plus the raw samples. `BenchRig` is the reusable part: the lead's `bench init` can open one
and run rollstack's systems against the same registry and link.
"""

from __future__ import annotations

import shlex
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from rollstack_bench.systems.baselines import SYSTEMS, InitTiming, PushedImages, Stack, make_system, prepare_images, stacks_from_corpus
from rollstack_bench.systems.containerd import Ctr, PrivateContainerd
from rollstack_bench.systems.registry import NetnsRegistry
from rollstack_bench.link.netem import DEFAULT_PROFILE, ShapedLink, cleanup_stale, measure
from rollstack_bench.report import init_summary
from rollstack.errors import InvalidRequest

DEFAULT_WORK = Path("/var/cache/rollstack/bench")


def default_command(stack: Stack) -> list[str]:
    """First command of an environment: the repository's Python with its test runner imported."""
    return ["/bin/sh", "-c", f"cd {shlex.quote(stack.workdir)} && python3 -c 'import pytest'"]


@dataclass
class BenchRig:
    """Link + registry (in its namespace) + private containerd + pushed images. Context manager."""

    work: Path = DEFAULT_WORK
    profile: str = DEFAULT_PROFILE
    link: ShapedLink = field(init=False)
    registry: NetnsRegistry = field(init=False)
    ctr: Ctr = field(init=False)
    link_measured: dict[str, float] = field(init=False, default_factory=dict)
    _stack: ExitStack = field(init=False, default_factory=ExitStack)

    def __enter__(self) -> "BenchRig":
        cleanup_stale()
        try:
            self.link = self._stack.enter_context(ShapedLink(self.profile))
            self.link_measured = measure(self.link, megabytes=16, pings=10)
            self.registry = self._stack.enter_context(NetnsRegistry(self.link, self.work / "registry"))
            self.ctr = self._stack.enter_context(PrivateContainerd(self.work / "ctd"))
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def push(self, stacks: Sequence[Stack]) -> dict[str, PushedImages]:
        return prepare_images(stacks, self.registry.address, self.work / "images")

    def link_facts(self) -> dict[str, Any]:
        return {**self.link.facts(), "measured": self.link_measured}


def measure_baselines(corpus: Path, *, systems: Sequence[str] = ("docker-equivalent", "dynamic-assembly"),
                      profile: str = DEFAULT_PROFILE, cold_runs: int = 3, warm_runs: int = 5,
                      work: Path = DEFAULT_WORK, command: Callable[[Stack], list[str]] = default_command,
                      stack_filter: Callable[[Stack], bool] = lambda s: True,
                      log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Cold and warm init of each baseline on the corpus's first matching stack."""
    from rollstack_corpus.build import load_corpus

    manifest, _ = load_corpus(corpus)
    candidates = stacks_from_corpus(corpus)
    stack = next((s for s in candidates if stack_filter(s)), None)
    if stack is None:
        raise InvalidRequest(f"no such stack; the corpus has {', '.join(s.name for s in candidates)}")
    for name in systems:
        if name not in SYSTEMS:
            raise InvalidRequest(f"unknown baseline {name!r} (one of {', '.join(SYSTEMS)})")
    stack_bytes = manifest.stack_bytes(stack.components)
    samples: dict[str, list[InitTiming]] = {}
    with BenchRig(work, profile) as rig:
        log(f"link {rig.link_facts()}")
        images = rig.push([stack])
        for name in systems:
            system = make_system(name, rig.ctr, rig.link, images, work / "systems")
            runs: list[InitTiming] = []
            for i in range(cold_runs):
                runs.append(system.cold_init(stack, command(stack)))
                log(f"{name} cold {i}: {runs[-1].first_cmd_s:.2f}s {runs[-1].bytes_pulled / 1e6:.0f} MB")
            if not cold_runs:  # warm runs need the image once
                system.warm_init(stack, command(stack))
            for i in range(warm_runs):
                runs.append(system.warm_init(stack, command(stack)))
                log(f"{name} warm {i}: {runs[-1].first_cmd_s:.3f}s")
            system.clear()
            samples[name] = runs
    doc_systems = {}
    for name, runs in samples.items():
        cold = [r for r in runs if r.cold]
        warm = [r for r in runs if not r.cold]
        s = init_summary([r.first_cmd_s for r in cold], [r.first_cmd_s for r in warm],
                         [r.bytes_pulled for r in cold], stack_bytes)
        s["cold_ready_p50"] = init_summary([r.ready_s for r in cold], [])["cold_init_p50"]
        s["cold_bytes_pulled"] = max((r.bytes_pulled for r in cold), default=0)
        s["failures"] = sum(r.exit_code != 0 for r in runs)
        doc_systems[name] = s
    return {
        "systems": doc_systems,
        "stack": {"name": stack.name, "components": stack.components, "bytes": stack_bytes,
                  "files": manifest.stack_files(stack.components)},
        "link": rig.link_facts(),
        "samples": {n: [r.to_dict() for r in runs] for n, runs in samples.items()},
    }
