"""The environment plan: what an environment is made of (see interface.md, "Plan file").

Pydantic v2 models, strict about shape (unknown keys are errors) and lenient about spelling
(sizes such as `256Mi`, `env` values given as numbers). `load_plan()` is the one entry point:
it reads YAML/JSON files, dicts or plans, resolves `mutation` into the diff text
(`mutation_text`), and turns every validation problem into one `PlanInvalid` whose message names
the field and the reason, e.g. `resources.memory: '12Qi' is not a size`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rollstack.core.units import GiB, parse_size
from rollstack.errors import InvalidRequest, PlanInvalid
from rollstack.plan.network import NetworkField, check_expose, check_network
from rollstack.plan.refs import GroupRef
from rollstack.plan.volumes import VolumeMount, check_mounts


def _check_groups(refs: list[str]) -> list[str]:
    if not refs:
        raise ValueError("at least one group is required")
    for ref in refs:
        try:
            GroupRef.parse(ref)
        except InvalidRequest as exc:
            raise ValueError(f"{ref!r}: {exc.message}") from None
    return refs


def _check_env(env: Any) -> dict[str, str]:
    if not isinstance(env, dict):
        raise ValueError(f"must be a mapping of variable names to strings, not {type(env).__name__}")
    out: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise ValueError(f"{key!r} is not a valid variable name")
        if isinstance(value, (dict, list)) or value is None:
            raise ValueError(f"{key}: value must be a string, not {type(value).__name__}")
        out[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def _check_abs(path: str) -> str:
    if not path.startswith("/") or "\0" in path:
        raise ValueError(f"{path!r} must be an absolute path")
    return path


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Resources(_Model):
    """Start values and caps; the provisioner moves the live quota between them."""

    cpu: float = Field(1.0, gt=0, allow_inf_nan=False)
    """cores at start"""
    memory: int = 1 * GiB
    """bytes at start (`256Mi`, `4Gi`, ...)"""
    max_cpu: float = Field(64.0, gt=0, allow_inf_nan=False)
    """the most cores the quota may grow to"""
    max_memory: int = 32 * GiB
    """the most bytes the quota may grow to"""

    @field_validator("memory", "max_memory", mode="before")
    @classmethod
    def _size(cls, v: Any) -> int:
        size = parse_size(v)
        if size <= 0:
            raise ValueError(f"{v!r} must be more than 0 bytes")
        return size

    @model_validator(mode="after")
    def _caps(self) -> "Resources":
        if self.cpu > self.max_cpu:
            raise ValueError(f"cpu {self.cpu} is above max_cpu {self.max_cpu}")
        if self.memory > self.max_memory:
            raise ValueError(f"memory {self.memory} is above max_memory {self.max_memory}")
        return self


class FetchPolicy(_Model):
    background: bool = True
    """fill the rest of the stack in the background once the environment is ready"""
    eager: bool = False
    """fetch every layer whole before the environment starts (the non-lazy baseline)"""


class Security(_Model):
    userns: bool | None = None
    """root inside as an unprivileged host uid range (rollstack.run.userns): unset = where the
    node supports it (runc), false = never, true = required (fails where unsupported)"""


class Evaluator(_Model):
    """A clean environment that scores a rollout (run by the node; parsed and resolved here)."""

    groups: list[str]
    """its own stack, bottom first (usually the task's groups without the harness + an evaluator)"""
    command: list[str] | str
    """argv, or a shell string run with `/bin/sh -c`"""
    workdir: str | None = None
    """defaults to the plan's workdir"""
    env: dict[str, str] = Field(default_factory=dict)
    reward: Literal["exit_code", "file"] = "exit_code"
    """exit_code: 1.0 when the command exits 0, else 0.0; file: a number read from reward_file"""
    reward_file: str | None = None
    """where the command writes its reward (absolute, or relative to workdir) when reward=file"""
    timeout: float = Field(600.0, gt=0, allow_inf_nan=False)

    _groups = field_validator("groups")(classmethod(lambda cls, v: _check_groups(v)))
    _env = field_validator("env", mode="before")(classmethod(lambda cls, v: _check_env(v)))

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str] | str) -> list[str] | str:
        if (isinstance(v, str) and not v.strip()) or (isinstance(v, list) and not v):
            raise ValueError("command must not be empty")
        return v

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str | None) -> str | None:
        return None if v is None else _check_abs(v)

    @model_validator(mode="after")
    def _reward(self) -> "Evaluator":
        if self.reward == "file" and not self.reward_file:
            raise ValueError("reward: file needs reward_file")
        return self

    @property
    def argv(self) -> list[str]:
        return ["/bin/sh", "-c", self.command] if isinstance(self.command, str) else list(self.command)


class Plan(_Model):
    """One environment: a stack of groups, an optional task mutation, and how to run it."""

    name: str = "unnamed"
    groups: list[str]
    """group references, bottom first; a higher group's files override lower ones"""
    mutation: str | None = None
    """a unified diff file (relative to the plan file) applied at init; paths in it are relative to workdir"""
    mutation_text: str | None = None
    """the diff itself (filled in by load_plan from `mutation`, or given inline)"""
    workdir: str = "/"
    env: dict[str, str] = Field(default_factory=dict)
    resources: Resources = Field(default_factory=Resources)
    network: NetworkField = "none"
    """none | outbound | {allow: [HOST:PORT, CIDR:PORT, ...]} (see rollstack.plan.network)"""
    expose: list[int] = Field(default_factory=list)
    """ports inside the environment the client reaches through the node's API"""
    volumes: list[VolumeMount] = Field(default_factory=list)
    """named node volumes mounted into the environment (rollstack.plan.volumes, docs/node.md#volumes)"""
    security: Security = Field(default_factory=Security)
    runtime: Literal["runc", "runsc"] = "runc"
    """runc (namespaces + cgroups + seccomp) or runsc (gVisor: a user-space kernel per environment)"""
    fetch: FetchPolicy = Field(default_factory=FetchPolicy)
    timeout: float = Field(1800.0, gt=0, allow_inf_nan=False)
    """seconds the environment may live"""
    setup: list[str] = Field(default_factory=list, max_length=64)
    """shell commands run in order (in workdir, `/bin/sh -c`) once the environment has started,
    before create answers; a non-zero exit fails the create (`command_failed`). A group
    (`count` > 1) runs them once and forks its environments from there (docs/fork.md)."""
    setup_timeout: float = Field(600.0, gt=0, allow_inf_nan=False)
    """seconds each setup command may run"""
    evaluator: Evaluator | None = None

    _groups = field_validator("groups")(classmethod(lambda cls, v: _check_groups(v)))
    _env = field_validator("env", mode="before")(classmethod(lambda cls, v: _check_env(v)))
    _workdir = field_validator("workdir")(classmethod(lambda cls, v: _check_abs(v)))

    _network = field_validator("network", mode="before")(classmethod(lambda cls, v: check_network(v)))
    _expose = field_validator("expose", mode="before")(classmethod(lambda cls, v: check_expose(v)))
    _volumes = field_validator("volumes")(classmethod(lambda cls, v: check_mounts(v)))

    @property
    def evaluator_workdir(self) -> str:
        return (self.evaluator.workdir if self.evaluator and self.evaluator.workdir else self.workdir)


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        # drop pydantic's union-branch labels such as `list[str]` / `str` from the location
        loc = re.sub(r"\.(list\[str\]|str|int|float)(?=\.|$)", "", loc)
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        elif err["type"] == "missing":
            msg = "is required"
        elif "input" in err and err["type"] not in ("model_type", "dict_type"):
            msg = f"{err['input']!r}: {msg}"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(dict.fromkeys(parts))


def _read_document(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise PlanInvalid(f"plan file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanInvalid(f"cannot read plan file {str(path)!r}: {exc}") from None
    try:
        doc = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise PlanInvalid(f"{path.name}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None
    if not isinstance(doc, dict):
        raise PlanInvalid(f"{path.name}: a plan must be a mapping, not {type(doc).__name__}")
    return doc


def _looks_like_diff(text: str) -> bool:
    return "\n" in text and any(
        line.startswith(("diff --git ", "--- ", "+++ ", "@@ ")) for line in text.splitlines()
    )


def _resolve_mutation(plan: Plan, base_dir: Path | None) -> Plan:
    if plan.mutation_text is not None or plan.mutation is None:
        return plan
    if _looks_like_diff(plan.mutation):  # inline diff given under `mutation:`
        return plan.model_copy(update={"mutation_text": plan.mutation, "mutation": None})
    path = Path(plan.mutation)
    if not path.is_absolute():
        path = (base_dir or Path.cwd()) / path
    try:
        text = path.read_bytes().decode("utf-8", errors="surrogateescape")
    except OSError as exc:
        raise PlanInvalid(f"mutation: cannot read {str(path)!r}: {exc.strerror or exc}") from None
    return plan.model_copy(update={"mutation_text": text})


def load_plan(source: Path | str | dict[str, Any] | Plan, *, base_dir: Path | None = None) -> Plan:
    """A validated `Plan` from a YAML/JSON file path, a dict, or a Plan; `mutation` resolved.

    A `str` is a file path. `base_dir` is where a relative `mutation` path is looked up
    (default: the plan file's directory, or the current directory for dicts). Raises PlanInvalid.
    """
    if isinstance(source, Plan):
        return _resolve_mutation(source, base_dir)
    if isinstance(source, (str, Path)):
        path = Path(source)
        doc = _read_document(path)
        base_dir = base_dir or path.resolve().parent
    elif isinstance(source, dict):
        doc = source
    else:
        raise PlanInvalid(f"a plan must be a file path, a mapping or a Plan, not {type(source).__name__}")
    try:
        plan = Plan.model_validate(doc)
    except ValidationError as exc:
        raise PlanInvalid(_describe(exc)) from None
    return _resolve_mutation(plan, base_dir)
