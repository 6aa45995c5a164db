"""Shared helpers of the API fuzz tests (tests/integration/{node,e2b}/test_*_fuzz.py).

- `fuzz_operations`: every operation of an OpenAPI document, fuzzed by schemathesis in both of
  its generation modes (schema-conforming and schema-violating requests), each case checked
  against the API's own claims (`CHECKS`). Returns the failures instead of stopping at the first,
  so one run reports every broken operation.
- `Canary`: a host directory whose paths are fed to the fuzzer; it must stay untouched.
- `tree_snapshot`: the files under a directory (to show nothing new appeared outside an
  environment's own directories).
- `ServerErrors`: records every ERROR the server side logged (a handler's traceback).

`ROLLSTACK_FUZZ_EXAMPLES` scales the examples per operation and mode (default: a CI-sized run).
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis.errors import Unsatisfiable
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("ROLLSTACK_FUZZ_EXAMPLES", "60"))
"""Generated requests per operation and generation mode."""


def checks() -> list[Any]:
    """No 5xx; the answer's status, content type and body as documented; a schema-violating
    request rejected (4xx)."""
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        negative_data_rejection,
        response_schema_conformance,
        status_code_conformance,
    )

    return [not_a_server_error, status_code_conformance, content_type_conformance,
            response_schema_conformance, negative_data_rejection]


Variants = Callable[[Any, Any], list[Any]]
"""(operation, generation mode) -> more case strategies mixed into that operation's generated
cases, e.g. `operation.as_strategy(generation_mode=mode, path_parameters={"env_id": live_id})`."""


def fuzz_operations(
    schema: Any,
    base_url: str,
    headers: dict[str, str],
    examples: int = EXAMPLES,
    variants: Variants | None = None,
    prepare: Callable[[Any], None] | None = None,
    limit: Callable[[Any], int] | None = None,
    accept: Callable[[Any, Any], bool] | None = None,
    timeout: float = 60.0,
) -> tuple[list[str], int]:
    """Fuzz every operation of `schema` against `base_url` with `headers` added to each request
    (auth). `prepare(case)` may bound a case before it is sent (e.g. an exec's timeout);
    `limit(operation)` caps an expensive operation's examples; `accept(case, response)` exempts an
    answer from the checks (a deliberate 501). Returns (failures, requests sent)."""
    from schemathesis import GenerationMode
    from schemathesis.core.result import Ok

    failures: list[str] = []
    sent = 0
    for result in schema.get_all_operations():
        if not isinstance(result, Ok):
            failures.append(f"schema error: {result.err()}")
            continue
        op = result.ok()
        n = min(examples, limit(op)) if limit is not None else examples
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            extra = variants(op, mode) if variants is not None else []
            strategy = st.one_of([op.as_strategy(generation_mode=mode)] + extra)

            @settings(max_examples=n, deadline=None, database=None, derandomize=False,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
                      verbosity=Verbosity.quiet)
            @given(case=strategy)
            def run(case: Any) -> None:
                nonlocal sent
                if prepare is not None:
                    prepare(case)
                sent += 1
                response = case.call(base_url=base_url, headers=headers, timeout=timeout)
                if accept is not None and accept(case, response):
                    return
                case.validate_response(response, checks=checks(), headers=headers)

            try:
                run()
            except Unsatisfiable:  # nothing in the operation can violate its schema (no parameters)
                continue
            except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - schemathesis' FailureGroup
                # is a BaseExceptionGroup; collected so that every operation gets its turn
                failures.append(f"{op.label} [{mode.value}]: {type(exc).__name__}: {_describe(exc)}")
    return failures, sent


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return str(exc) + "".join(f"\n  - {type(e).__name__}: {e}" for e in exc.exceptions)
    return str(exc)


@dataclass
class Canary:
    """A host directory (holding one file) the API must never write to: its paths, and paths
    that climb out of an environment towards it, are handed to the fuzzer."""

    root: Path

    @classmethod
    def make(cls, where: Path) -> "Canary":
        where.mkdir(parents=True, exist_ok=True)
        (where / "keep.txt").write_text("canary\n")
        return cls(where)

    def paths(self) -> list[str]:
        c = str(self.root)
        return [f"{c}/written", f"{c}/keep.txt", f"{c}", f"{c}/new/dir/written",
                f"../../../../../../../../..{c}/written", f"/..{c}/written", f"/../../..{c}/keep.txt",
                f"{c}/../{self.root.name}/written", f"//{c}//written", f"/proc/self/root{c}/written",
                f"/proc/1/root{c}/written", f"/proc/self/cwd/../../../../..{c}/written"]

    def state(self) -> dict[str, Any]:
        return tree_snapshot(self.root, content=True)


def tree_snapshot(root: Path, skip: Iterable[str] = (), content: bool = False) -> dict[str, Any]:
    """Relative path -> (type, size[, bytes]) of everything under `root` (symlinks not followed),
    leaving out the top-level entries named in `skip`."""
    out: dict[str, Any] = {}
    skipped = set(skip)
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        if rel_dir == Path("."):
            dirnames[:] = [d for d in dirnames if d not in skipped]
            filenames = [f for f in filenames if f not in skipped]
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            try:
                st_ = p.lstat()
            except FileNotFoundError:
                continue
            kind = "dir" if stat.S_ISDIR(st_.st_mode) else "link" if stat.S_ISLNK(st_.st_mode) else "file"
            entry: tuple[Any, ...] = (kind, st_.st_size if kind == "file" else 0)
            if content and kind == "file":
                entry += (p.read_bytes(),)
            out[str(rel_dir / name)] = entry
    return out


class ServerErrors(logging.Handler):
    """Collects ERROR records of the server's loggers while installed (a `with` block)."""

    LOGGERS = ("uvicorn.error", "rollstack")

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.name}: {record.getMessage()}"
                            + (f" ({record.exc_info[1]!r})" if record.exc_info else ""))

    def __enter__(self) -> "ServerErrors":
        for name in self.LOGGERS:
            logging.getLogger(name).addHandler(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        for name in self.LOGGERS:
            logging.getLogger(name).removeHandler(self)
