"""The corpus's value objects: tasks in the SWE-smith schema, components and the manifest.

Pure data and validation, no I/O. A task is one injected bug in one repository:

- `patch` is the bug as a unified diff relative to the repository workdir (`a/` and `b/` prefixes,
  applies with `git apply` or `patch -p1`), `fix` is its reverse (the reference solution);
- `FAIL_TO_PASS` names tests (pytest node ids) that fail with the bug and pass without it;
- `PASS_TO_PASS` names tests of the same test files that pass either way;
- `test_command` runs exactly those test files from the workdir.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rollstack.errors import InvalidRequest

ComponentKind = Literal["os", "repo", "harness", "evaluator"]

_INSTANCE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class Task(BaseModel):
    """One task in the SWE-smith schema: the one task model of rollstack.

    Lenient about what a task file may leave out (`fix`, `test_command`, `workdir`, the test
    lists; SWE-bench-style exports that store the lists as JSON strings; unknown fields are
    kept), strict about the shape of what it gives (ids, diffs, paths). A task of the built
    corpus must be complete: `validate_tasks` checks that.
    """

    model_config = ConfigDict(extra="allow")

    instance_id: str
    """Unique, `<repo>.<version>.<kind>__<n>` (letters, digits, `.`, `_`, `-`)."""
    repo: str
    """Name of the repository (`repo-<repo>` in the corpus; may be `owner/name`)."""
    patch: str = ""
    """The injected bug: a unified diff relative to `workdir`."""
    FAIL_TO_PASS: list[str] = Field(default_factory=list)
    """Tests that fail with the bug and pass without it."""
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    """Tests of the same files that pass with and without the bug."""
    fix: str | None = None
    """The reference solution: the reverse of `patch`."""
    test_command: str | None = None
    """Shell command, run from `workdir`, that runs the tests named above."""
    workdir: str | None = None
    """Absolute path of the repository inside the environment (default `/work/<repo name>`)."""
    version: str = ""
    """The repository's release (sdist version)."""
    mutation: dict[str, Any] = Field(default_factory=dict)
    """How the bug was made: file, line, function, kind, old/new text."""
    problem_statement: str | None = None
    """What an agent is told, when the task file has it."""

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, v: Any) -> Any:
        # SWE-bench-style exports store these lists as JSON strings.
        return json.loads(v) if isinstance(v, str) else v

    @field_validator("instance_id")
    @classmethod
    def _id_ok(cls, v: str) -> str:
        if not _INSTANCE_ID.match(v):
            raise ValueError(f"instance_id {v!r} must match {_INSTANCE_ID.pattern}")
        return v

    @field_validator("patch", "fix")
    @classmethod
    def _is_diff(cls, v: str | None) -> str | None:
        if v and not _looks_like_diff(v):
            raise ValueError("not a unified diff with a/ b/ headers and at least one hunk")
        return v

    @field_validator("workdir")
    @classmethod
    def _abs(cls, v: str | None) -> str | None:
        if v is not None and (not v.startswith("/") or ".." in v.split("/")):
            raise ValueError("workdir must be an absolute path without '..'")
        return v

    def resolved_workdir(self) -> str:
        return self.workdir or f"/work/{self.repo.rsplit('/', 1)[-1]}"

    def prompt(self) -> str:
        """What an agent is told: the problem statement, else the failing tests."""
        if self.problem_statement:
            return self.problem_statement
        tests = "\n".join(f"- {t}" for t in self.FAIL_TO_PASS[:20])
        more = f"\n(and {len(self.FAIL_TO_PASS) - 20} more)" if len(self.FAIL_TO_PASS) > 20 else ""
        run = f"\nRun them with: {self.test_command}" if self.test_command else ""
        return f"Fix the bug in {self.repo} so that these failing tests pass:\n{tests}{more}{run}"

    def score_document(self) -> dict[str, Any]:
        """The fields the corpus scorer reads (kept small: it travels in the evaluator's command)."""
        return {
            "instance_id": self.instance_id,
            "workdir": self.resolved_workdir(),
            "test_command": self.test_command or "",
            "FAIL_TO_PASS": self.FAIL_TO_PASS,
            "PASS_TO_PASS": self.PASS_TO_PASS,
        }


def _looks_like_diff(text: str) -> bool:
    lines = text.splitlines()
    has_old = any(line.startswith("--- a/") for line in lines)
    has_new = any(line.startswith("+++ b/") for line in lines)
    has_hunk = any(line.startswith("@@ ") for line in lines)
    return has_old and has_new and has_hunk


def validate_tasks(tasks: Iterable[Task]) -> None:
    """Corpus-level checks: every task complete, unique ids, disjoint test lists."""
    seen: set[str] = set()
    for t in tasks:
        missing = [k for k in ("patch", "fix", "test_command", "workdir", "FAIL_TO_PASS") if not getattr(t, k)]
        if missing:
            raise InvalidRequest(f"{t.instance_id}: a corpus task needs {', '.join(missing)}")
        if t.instance_id in seen:
            raise InvalidRequest(f"duplicate instance_id {t.instance_id}")
        seen.add(t.instance_id)
        both = set(t.FAIL_TO_PASS) & set(t.PASS_TO_PASS)
        if both:
            raise InvalidRequest(f"{t.instance_id}: tests both FAIL_TO_PASS and PASS_TO_PASS: {sorted(both)[:3]}")


def dump_tasks(tasks: Iterable[Task]) -> str:
    """tasks.jsonl text: one JSON object per line, fields in schema order."""
    return "".join(json.dumps(t.model_dump(exclude_none=True), sort_keys=False) + "\n" for t in tasks)


def load_tasks(text: str) -> list[Task]:
    """Parse tasks.jsonl text; raises InvalidRequest naming the bad line."""
    tasks: list[Task] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            tasks.append(Task.model_validate_json(line))
        except ValidationError as exc:
            raise InvalidRequest(f"tasks.jsonl line {n}: {exc.errors()[0].get('msg')}") from exc
    validate_tasks(tasks)
    return tasks


class Component(BaseModel):
    """One directory tree of the corpus (a layer group to publish)."""

    name: str
    """Directory name inside the corpus: `os`, `repo-<name>`, `harness-<name>`, `evaluator`."""
    kind: ComponentKind
    group: str
    """Suggested group reference, e.g. `repo/more-itertools:10.5.0`."""
    base: str | None = None
    """Component this one is a diff over (`os`), None for the base."""
    bytes: int = 0
    """Apparent size of regular files and symlinks."""
    files: int = 0
    """Number of non-directory entries."""
    whiteouts: int = 0
    """Overlay whiteouts (0/0 char devices): deletions of files of the base."""
    info: dict[str, Any] = Field(default_factory=dict)
    """Kind-specific facts (workdir, version, test_command, entry point...)."""


class CorpusManifest(BaseModel):
    """manifest.json: what a built corpus holds."""

    flavor: Literal["small", "full"]
    components: list[Component]
    tasks: int
    tasks_per_repo: dict[str, int] = Field(default_factory=dict)
    build_seconds: float = 0.0
    built_at: str = ""

    def component(self, name: str) -> Component:
        for c in self.components:
            if c.name == name:
                return c
        raise InvalidRequest(f"no component {name!r} in corpus")

    def stack_bytes(self, names: Iterable[str]) -> int:
        return sum(self.component(n).bytes for n in names)

    def stack_files(self, names: Iterable[str]) -> int:
        return sum(self.component(n).files for n in names)
