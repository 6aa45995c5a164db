"""The rollout model of `bench iteration` (pure): a rollout's phase record and clock, the
iteration summary, the job list, and the scripted agent's steps (harness check, read, test, fix,
retest) as shell commands."""

from __future__ import annotations

import itertools
import os
import shlex
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from rollstack.errors import InvalidRequest

_EOF = "ROLLSTACK_PATCH_EOF_7f3a"


@dataclass
class Rollout:
    system: str
    task: str
    rollout: int
    phases: list[dict[str, Any]] = field(default_factory=list)
    """[{"name": init|exec|eval|destroy, "start": s, "end": s}] seconds since the iteration began"""
    reward: float | None = None
    error: str = ""
    fetched_bytes: int = 0
    steps: dict[str, int] = field(default_factory=dict)
    """exit code of each agent step"""
    eval_env_init_s: float = 0.0
    """seconds of the eval phase spent creating the evaluator environment (environment init too)"""
    step_s: dict[str, float] = field(default_factory=dict)
    """seconds of each agent step (bench iteration --image)"""
    eval_cmd_s: float = 0.0
    """seconds of the eval phase spent running the evaluator's command (bench iteration --image)"""
    fuse_lowers: bool | None = None
    """rollstack: the rollout's environment stacked FUSE lowers (a layer not materialized yet)"""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "label": f"{self.task}#{self.rollout}"}

    def duration(self, name: str) -> float:
        return sum(p["end"] - p["start"] for p in self.phases if p["name"] == name)


class PhaseClock:
    """Records consecutive phases of one rollout relative to the iteration's start."""

    def __init__(self, rec: Rollout, t0: float) -> None:
        self.rec, self.t0 = rec, t0

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter() - self.t0
        try:
            return fn()
        finally:
            self.rec.phases.append({"name": name, "start": start, "end": time.perf_counter() - self.t0})


def iteration_summary(rollouts: Sequence[Rollout], wall: float) -> dict[str, Any]:
    from rollstack_bench.report import phase_shares
    from rollstack.core.stats import percentile

    shares = phase_shares(r.to_dict() for r in rollouts)
    totals = [sum(p["end"] - p["start"] for p in r.phases) for r in rollouts]
    whole = sum(totals)
    env_init = sum(r.duration("init") + r.eval_env_init_s for r in rollouts)
    return {
        "env_init_share": env_init / whole if whole else float("nan"),
        "iteration_s": wall, "rollouts": len(rollouts),
        "ok": sum(1 for r in rollouts if r.reward == 1.0),
        "errors": sum(1 for r in rollouts if r.error),
        "init_share": shares.get("init", float("nan")), "exec_share": shares.get("exec", float("nan")),
        "eval_share": shares.get("eval", float("nan")), "destroy_share": shares.get("destroy", float("nan")),
        "init_p50": percentile([r.duration("init") for r in rollouts], 50),
        "init_p95": percentile([r.duration("init") for r in rollouts], 95),
        "rollout_p50": percentile(totals, 50),
        "fetched_bytes_p50": percentile([r.fetched_bytes for r in rollouts], 50),
    }


def jobs(tasks: Sequence[dict[str, Any]], n_tasks: int, rollouts: int) -> list[tuple[dict[str, Any], int]]:
    """GRPO order: the K rollouts of a task together; tasks taken round-robin over repositories
    (so a batch smaller than the corpus still spans every repository), cycled if too few."""
    if n_tasks < 1 or rollouts < 1:
        raise InvalidRequest("--tasks and --rollouts must be >= 1")
    if not tasks:
        raise InvalidRequest("the corpus has no tasks")
    by_repo: dict[str, list[dict[str, Any]]] = {}
    for t in tasks:
        by_repo.setdefault(str(t.get("repo", "")), []).append(t)
    spread = [t for group in itertools.zip_longest(*by_repo.values()) for t in group if t is not None]
    picked = list(itertools.islice(itertools.cycle(spread), n_tasks))
    return [(t, k) for t in picked for k in range(rollouts)]


def default_concurrency() -> int:
    """Rollouts in flight: two per core (rollouts wait on I/O and on each other's tests)."""
    return max(2, 2 * (os.cpu_count() or 1))


def harness_command(entry: str) -> str:
    """Start the harness without a model: the corpus's own check of it (`mini --help`: mini-swe-agent
    has no --version; `claude --version`), else `<binary> --version`."""
    parts = entry.split()
    if not parts:
        raise InvalidRequest("the harness has no entry command")
    if len(parts) == 1:
        parts.append("--version")
    return " ".join(shlex.quote(p) for p in parts)


def agent_steps(task: dict[str, Any], harness_entry: str) -> list[tuple[str, str, str | None]]:
    """(step, shell command run in the workdir, stdin) of the scripted agent."""
    ids = " ".join(shlex.quote(t) for t in task["FAIL_TO_PASS"])
    test = f"python3 -B -m pytest -p no:cacheprovider -q {ids}"  # -B: rollstack.tasks.plans.failing_tests_command
    path = shlex.quote(task.get("mutation", {}).get("path", "."))
    return [
        ("harness", harness_command(harness_entry), None),
        ("read", f"ls >/dev/null && head -c 65536 {path} >/dev/null", None),
        ("test_before", test, None),
        ("fix", "git apply --verbose -", task["fix"]),
        ("test_after", test, None),
    ]


def heredoc(cmd: str, stdin: str | None) -> str:
    """`cmd` with `stdin` fed from a here-document (ctr tasks exec has no stdin of ours)."""
    if stdin is None:
        return cmd
    if _EOF in stdin:
        raise InvalidRequest("patch contains the here-document marker")
    body = stdin if stdin.endswith("\n") else stdin + "\n"
    return f"{cmd} <<'{_EOF}'\n{body}{_EOF}\n"
