"""Pure episode logic: submission rule (mini-swe-agent's), output merging, limits."""

from __future__ import annotations

from rollstack.integrations.episode import (
    MERGE_PREFIX,
    EpisodeLimits,
    EpisodeState,
    merged_output,
    shell_argv,
    submission_of,
)

M = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def test_submission_rule_matches_minisweagent() -> None:
    assert submission_of(f"{M}\n", 0) == ""
    assert submission_of(f"\n\n  {M}  \nline 1\nline 2\n", 0) == "line 1\nline 2\n"
    assert submission_of(f"{M}\ndiff --git a/x b/x\n", 1) is None  # must exit 0
    assert submission_of(f"hello\n{M}\n", 0) is None  # must be the first line
    assert submission_of(f"{M}X\n", 0) is None
    assert submission_of("", 0) is None
    assert submission_of("DONE\nrest", 0, marker="DONE") == "rest"


def test_merge_and_shell_argv() -> None:
    assert merged_output("a\n", "") == "a\n"
    assert merged_output("a", "b\n") == "a\nb\n"
    assert merged_output("a\n", "b\n") == "a\nb\n"
    assert merged_output("", "b\n") == "b\n"
    assert shell_argv("ls", [], True) == MERGE_PREFIX + "ls"
    assert shell_argv("ls", [], False) == "ls"
    assert shell_argv("ls", ["bash", "-lc"], True) == ["bash", "-lc", MERGE_PREFIX + "ls"]


def test_limits() -> None:
    s = EpisodeState(EpisodeLimits(max_steps=2, max_seconds=10.0), started=100.0)
    assert s.out_of_budget(now=101.0) is None
    s.steps = 2
    assert s.out_of_budget(now=101.0) == "step_limit"
    s.steps = 1
    assert s.out_of_budget(now=110.0) == "time_limit"
    assert s.remaining_seconds(now=104.0) == 6.0
    unlimited = EpisodeState(EpisodeLimits(max_steps=0, max_seconds=0.0), started=0.0)
    unlimited.steps = 10**6
    assert unlimited.out_of_budget(now=1e9) is None and unlimited.remaining_seconds() is None
