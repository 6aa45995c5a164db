"""mini-swe-agent (v2) environment backed by a rollstack environment.

    environment:
      environment_class: rollstack.integrations.minisweagent.RollstackEnvironment
      plan: tasks/attrs-0042.yaml        # or the plan inline as a mapping
      timeout: 60                        # seconds per command (mini-swe-agent's meaning)

Semantics mirror mini-swe-agent's `DockerEnvironment`:
- `execute(action)` runs `action["command"]` with a shell (`/bin/sh -c`, or `interpreter` + the
  command), stdout and stderr merged into one stream (`exec 2>&1`, the fd-level merge docker's
  `stderr=STDOUT` gives), and returns `{"output", "returncode", "exception_info"}`;
- a command that runs past its timeout returns `returncode -1` and the `exception_info` /
  `extra.exception_type == "TimeoutExpired"` that docker's `subprocess.TimeoutExpired` produces,
  with the partial output;
- output whose first line is `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` from a command that exited 0
  raises `minisweagent.exceptions.Submitted` carrying the rest of the output as the submission.

Differences, on purpose: the environment is created at construction (like docker's container)
unless `lazy: true` (then on the first `execute`); errors after which no command can ever succeed
again (`fatal_errors`, e.g. `oom_terminated`) are raised instead of being returned as output, so
an RL loop can resample the rollout instead of burning the step budget. `cleanup()` destroys the
environment (idempotent); it also runs on garbage collection, as docker's does.
"""

from __future__ import annotations

import logging
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, field_validator

try:
    from minisweagent.exceptions import Submitted
    from minisweagent.utils.serialize import recursive_merge
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "rollstack.integrations.minisweagent needs mini-swe-agent: pip install 'rollstack[minisweagent]'"
    ) from exc

from rollstack.errors import ExecTimeout, RollstackError
from rollstack.integrations.connect import sync_client
from rollstack.integrations.episode import SUBMIT_MARKER, merged_output, shell_argv, submission_of

DEFAULT_FATAL = ["oom_terminated", "environment_gone", "environment_not_found", "unauthorized"]


class RollstackEnvironmentConfig(BaseModel):
    """Keyword arguments of `RollstackEnvironment` (mini-swe-agent's `environment:` section)."""

    plan: str | dict[str, Any]
    """A plan file path (YAML/JSON; its mutation file is read relative to it) or the plan as a mapping."""
    node: str | None = None
    """Node agent URL (default: $ROLLSTACK_NODE, else http://127.0.0.1:7878)."""
    token: str | None = Field(default=None, exclude=True, repr=False)
    """Bearer token (default: $ROLLSTACK_TOKEN, else the node's token file). Never serialized."""
    cwd: str = ""
    """Working directory for commands (default: the plan's workdir)."""
    env: dict[str, str] = {}
    """Environment variables for every command, on top of the plan's."""
    forward_env: list[str] = []
    """Host variables to forward (when set); `env` wins on conflict (as in docker's config)."""
    timeout: int = 30
    """Seconds a command may run (mini-swe-agent's per-action timeout)."""
    interpreter: list[str] = []
    """Empty: the command goes to /bin/sh -c. Else e.g. ["bash", "-lc"] (must be a POSIX shell
    when `merge_stderr` is on)."""
    merge_stderr: bool = True
    """Merge stderr into stdout at the fd level (true order); off: stdout then stderr."""
    lazy: bool = False
    """Create the rollstack environment on the first `execute` instead of at construction."""
    fatal_errors: list[str] = Field(default_factory=lambda: list(DEFAULT_FATAL))
    """Error codes raised (typed `rollstack.errors`) instead of returned as a failed command."""
    submit_marker: str = SUBMIT_MARKER

    @field_validator("plan", mode="before")
    @classmethod
    def _plan_path(cls, v: Any) -> Any:
        return str(v) if isinstance(v, Path) else v


class RollstackEnvironment:
    def __init__(
        self,
        *,
        config_class: type = RollstackEnvironmentConfig,
        logger: logging.Logger | None = None,
        client: Any = None,
        **kwargs: Any,
    ) -> None:
        """See `RollstackEnvironmentConfig` for keyword arguments. `client`: an existing `Client` or
        in-process `rollstack.Node` to use (left open by `cleanup`); else one is built from
        `node`/`token` and closed by `cleanup`."""
        self.logger = logger or logging.getLogger("minisweagent.environment")
        self.config = config_class(**kwargs)
        self.env: Any = None
        self._client, self._owns_client = sync_client(client, self.config.node, self.config.token)
        if not self.config.lazy:
            try:
                self._ensure_env()
            except BaseException:
                self._close_client()
                raise

    # -- lifecycle -------------------------------------------------------------------------------

    def _ensure_env(self) -> Any:
        if self.env is None:
            self.env = self._client.create(self.config.plan)
            created = getattr(self.env, "created", None)
            total = created.timings.total if created is not None else float("nan")
            self.logger.info(f"Created rollstack environment {self.env.id} in {total:.2f}s")
        return self.env

    @property
    def environment_id(self) -> str | None:
        return self.env.id if self.env is not None else None

    def cleanup(self) -> None:
        """Destroy the rollstack environment (idempotent) and close a client built here."""
        env, self.env = getattr(self, "env", None), None
        if env is not None:
            try:
                env.destroy()
            except Exception as exc:  # cleanup must not mask the agent's own outcome
                self.logger.warning(f"destroying rollstack environment {env.id} failed: {exc}")
        self._close_client()

    def _close_client(self) -> None:
        if getattr(self, "_owns_client", False):
            self._owns_client = False
            try:
                self._client.close()
            except Exception:
                pass

    def __del__(self) -> None:
        try:
            self.cleanup()
        except Exception:
            pass

    def __enter__(self) -> "RollstackEnvironment":
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    # -- mini-swe-agent's Environment protocol ---------------------------------------------------

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run `action["command"]`; see the module docstring for the result's shape."""
        command = action.get("command", "")
        cwd = cwd or self.config.cwd or None
        timeout = timeout or self.config.timeout
        try:
            env = self._ensure_env()
            result = env.exec(
                shell_argv(command, self.config.interpreter, self.config.merge_stderr),
                timeout=timeout,
                cwd=cwd,
                env=self._command_env(),
            )
            text = merged_output(result.stdout, result.stderr)
            if result.timed_out:
                output = _timeout_output(command, timeout, text)
            else:
                output = {"output": text, "returncode": result.exit_code, "exception_info": ""}
                if getattr(result, "truncated", False):
                    output["extra"] = {"output_truncated": True}
        except ExecTimeout as exc:
            output = _timeout_output(command, timeout, "", detail=str(exc))
        except RollstackError as exc:
            if exc.code in self.config.fatal_errors:
                raise
            output = _error_output(exc, code=exc.code)
        except Exception as exc:
            output = _error_output(exc)
        self._check_finished(output)
        return output

    def _command_env(self) -> dict[str, str]:
        forwarded = {k: v for k in self.config.forward_env if (v := os.getenv(k)) is not None}
        return forwarded | self.config.env

    def _check_finished(self, output: dict) -> None:
        """Raises Submitted if the output indicates task completion (docker's rule, verbatim)."""
        submission = submission_of(output.get("output", ""), output["returncode"], self.config.submit_marker)
        if submission is not None:
            raise Submitted(
                {
                    "role": "exit",
                    "content": submission,
                    "extra": {"exit_status": "Submitted", "submission": submission},
                }
            )

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return recursive_merge(
            self.config.model_dump(), platform.uname()._asdict(), {"environment_id": self.environment_id}, kwargs
        )

    def serialize(self) -> dict:
        info: dict[str, Any] = {
            "config": {
                "environment": self.config.model_dump(mode="json"),
                "environment_type": f"{self.__class__.__module__}.{self.__class__.__name__}",
            },
        }
        created = getattr(self.env, "created", None)
        info["rollstack"] = {
            "environment_id": self.environment_id,
            "timings": created.timings.model_dump() if created is not None else None,
            "fetch": created.fetch.model_dump() if created is not None else None,
        }
        return {"info": info}


def _timeout_output(command: str, timeout: float, text: str, detail: str = "") -> dict[str, Any]:
    # The very exception docker's subprocess.run raises, so messages and types match exactly.
    exc = subprocess.TimeoutExpired(command, timeout, output=text)
    return {
        "output": text,
        "returncode": -1,
        "exception_info": f"An error occurred while executing the command: {exc}",
        "extra": {"exception_type": type(exc).__name__, "exception": detail or str(exc)},
    }


def _error_output(exc: Exception, code: str | None = None) -> dict[str, Any]:
    raw = getattr(exc, "output", None)
    raw = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else (raw if isinstance(raw, str) else "")
    extra: dict[str, Any] = {"exception_type": type(exc).__name__, "exception": str(exc)}
    if code:
        extra["code"] = code
    return {
        "output": raw,
        "returncode": -1,
        "exception_info": f"An error occurred while executing the command: {exc}",
        "extra": extra,
    }
