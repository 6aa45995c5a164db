"""Pure episode logic shared by the adapters: submission detection, output merging, limits.

Submission follows mini-swe-agent's own environments exactly (docker.py/local.py
`_check_finished`): the output, left-stripped, has as its first line (stripped) the marker, and
the command exited 0; the submission is every line after it, verbatim.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

MERGE_PREFIX = "exec 2>&1\n"
"""Prepended to a shell command so stderr goes to stdout at the file-descriptor level: one stream
in true order, as `subprocess.run(..., stderr=STDOUT)` gives mini-swe-agent's docker environment."""


def submission_of(output: str, returncode: int, marker: str = SUBMIT_MARKER) -> str | None:
    """The submitted text if this command's output is a submission, else None."""
    lines = output.lstrip().splitlines(keepends=True)
    if lines and lines[0].strip() == marker and returncode == 0:
        return "".join(lines[1:])
    return None


def merged_output(stdout: str, stderr: str) -> str:
    """stdout then whatever reached stderr (empty when the command was run with MERGE_PREFIX)."""
    if not stderr:
        return stdout
    if stdout and not stdout.endswith("\n"):
        return stdout + "\n" + stderr
    return stdout + stderr


def shell_argv(command: str, interpreter: list[str], merge: bool) -> str | list[str]:
    """What to send to the node: a shell string (run by /bin/sh -c) or interpreter argv."""
    text = MERGE_PREFIX + command if merge else command
    if not interpreter:
        return text
    return [*interpreter, text]


@dataclass
class EpisodeLimits:
    max_steps: int = 50
    """Actions per episode before it is truncated (0: no limit)."""
    max_seconds: float = 0.0
    """Wall-clock seconds per episode, from reset, before it is truncated (0: no limit)."""


@dataclass
class EpisodeState:
    """Counters of one episode; `done` once terminated or truncated."""

    limits: EpisodeLimits
    started: float = field(default_factory=time.monotonic)
    steps: int = 0
    done: bool = False
    exec_seconds: float = 0.0

    def elapsed(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.started

    def out_of_budget(self, now: float | None = None) -> str | None:
        """'step_limit' / 'time_limit' when the episode must be truncated now, else None."""
        if 0 < self.limits.max_steps <= self.steps:
            return "step_limit"
        if 0 < self.limits.max_seconds <= self.elapsed(now):
            return "time_limit"
        return None

    def remaining_seconds(self, now: float | None = None) -> float | None:
        if self.limits.max_seconds <= 0:
            return None
        return max(self.limits.max_seconds - self.elapsed(now), 0.001)
