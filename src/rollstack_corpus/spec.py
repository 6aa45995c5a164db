"""What goes into a corpus: the OS, repositories, harnesses and evaluator, as value objects.

Versions are pinned so a corpus is reproducible from the package registries alone. Each
repository names the source files bugs are injected into and the (fast, offline) test files
that cover them; `small()` is the demo corpus (one repository, one harness, 4 tasks), `full()`
the benchmark corpus (5 repositories, 2 harnesses, >= 32 tasks, >= 1 GB per stack).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import asdict, dataclass, field
from typing import Literal

DEBIAN_MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "python3-pip", "git", "ca-certificates")
BUILD_PACKAGES = ("build-essential", "python3-dev", "curl", "procps", "less", "patch", "ripgrep")
EVALUATOR_PYTEST = "8.3.4"
# pytest and its dependencies, pinned: the registries move on, a corpus should not.
PYTEST_PINS = ("pytest==8.3.4", "pluggy==1.5.0", "iniconfig==2.0.0", "packaging==24.1")


def test_command(files: tuple[str, ...] | list[str]) -> str:
    """The command that runs these test files from the workdir (no cache dir written)."""
    return "python3 -m pytest -p no:cacheprovider -q " + " ".join(shlex.quote(f) for f in files)


@dataclass(frozen=True)
class RepoSpec:
    """A PyPI project whose sdist ships its tests, installed editable at /work/<name>."""

    name: str
    version: str
    test_deps: tuple[str, ...]
    mutate: tuple[str, ...]
    """Source files (relative to the workdir) bugs are injected into."""
    tests: tuple[str, ...]
    """Test files (relative to the workdir) run for discovery and named in test_command."""
    test_map: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Optional (source file, its test files) pairs: discovery then runs only those tests."""

    @property
    def workdir(self) -> str:
        return f"/work/{self.name}"

    @property
    def test_command(self) -> str:
        return test_command(self.tests)

    @property
    def group(self) -> str:
        return f"repo/{self.name}:{self.version}"

    def tests_for(self, source: str) -> tuple[str, ...]:
        """The test files that cover `source` (all of `tests` unless test_map says otherwise)."""
        return dict(self.test_map).get(source, self.tests)


@dataclass(frozen=True)
class HarnessSpec:
    """An agent harness installed in its own prefix over the OS tree."""

    name: str
    version: str
    kind: Literal["pip-venv", "npm"]
    package: str
    prefix: str
    entry: str
    """Command that proves the harness starts (no model is reachable): `... --version`/`--help`."""
    apt: tuple[str, ...] = ()
    """Debian packages the harness needs (installed into the harness tree)."""

    @property
    def group(self) -> str:
        return f"harness/{self.name}:{self.version}"


@dataclass(frozen=True)
class CorpusSpec:
    flavor: Literal["small", "full"]
    os_packages: tuple[str, ...]
    repos: tuple[RepoSpec, ...]
    harnesses: tuple[HarnessSpec, ...]
    tasks_per_repo: int
    candidates_per_repo: int
    max_fail_to_pass: int = 25
    """A bug breaking more tests than this is too blunt to be a task."""
    evaluator_pytest: str = EVALUATOR_PYTEST
    extra: dict[str, str] = field(default_factory=dict)

    def fingerprint(self, part: str) -> str:
        """Stable hash of the whole spec plus `part` (the manifest's cache key)."""
        return _hash({"part": part, "spec": asdict(self)})

    def repo_fingerprint(self, repo: RepoSpec) -> str:
        """Cache key of a repository tree: what is downloaded and installed."""
        return _hash([self.os_fingerprint(), repo.name, repo.version, repo.test_deps])

    def tasks_fingerprint(self, repo: RepoSpec) -> str:
        """Cache key of a repository's tasks: the tree, the sampling and the checking."""
        return _hash([self.repo_fingerprint(repo), asdict(repo), self.tasks_per_repo, self.candidates_per_repo,
                      self.max_fail_to_pass, self.evaluator_pytest])

    def os_fingerprint(self) -> str:
        return _hash([SUITE, DEBIAN_MIRROR, self.os_packages])


def _hash(doc: object) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


MORE_ITERTOOLS = RepoSpec(
    name="more-itertools", version="10.5.0", test_deps=PYTEST_PINS,
    mutate=("more_itertools/more.py", "more_itertools/recipes.py"),
    tests=("tests/test_more.py", "tests/test_recipes.py"),
    test_map=(("more_itertools/more.py", ("tests/test_more.py",)),
              ("more_itertools/recipes.py", ("tests/test_recipes.py",))),
)
TOOLZ = RepoSpec(
    name="toolz", version="1.0.0", test_deps=PYTEST_PINS,
    mutate=("toolz/itertoolz.py", "toolz/dicttoolz.py", "toolz/functoolz.py"),
    tests=("toolz/tests/test_itertoolz.py", "toolz/tests/test_dicttoolz.py", "toolz/tests/test_functoolz.py"),
    test_map=(("toolz/itertoolz.py", ("toolz/tests/test_itertoolz.py",)),
              ("toolz/dicttoolz.py", ("toolz/tests/test_dicttoolz.py",)),
              ("toolz/functoolz.py", ("toolz/tests/test_functoolz.py",))),
)
ATTRS = RepoSpec(
    name="attrs", version="24.2.0", test_deps=PYTEST_PINS + ("hypothesis==6.112.2", "sortedcontainers==2.4.0", "pympler==1.1", "cloudpickle==3.0.0"),
    mutate=("src/attr/validators.py", "src/attr/converters.py", "src/attr/_funcs.py"),
    tests=("tests/test_validators.py", "tests/test_converters.py", "tests/test_funcs.py"),
    test_map=(("src/attr/validators.py", ("tests/test_validators.py",)),
              ("src/attr/converters.py", ("tests/test_converters.py",)),
              ("src/attr/_funcs.py", ("tests/test_funcs.py",))),
)
PACKAGING = RepoSpec(
    name="packaging", version="24.1", test_deps=PYTEST_PINS + ("pretend==1.0.9",),
    mutate=("src/packaging/version.py", "src/packaging/specifiers.py"),
    tests=("tests/test_version.py", "tests/test_specifiers.py"),
    test_map=(("src/packaging/version.py", ("tests/test_version.py",)),
              ("src/packaging/specifiers.py", ("tests/test_specifiers.py",))),
)
BOLTONS = RepoSpec(
    name="boltons", version="24.0.0", test_deps=PYTEST_PINS,
    mutate=("boltons/iterutils.py", "boltons/strutils.py"),
    tests=("tests/test_iterutils.py", "tests/test_strutils.py"),
    test_map=(("boltons/iterutils.py", ("tests/test_iterutils.py",)),
              ("boltons/strutils.py", ("tests/test_strutils.py",))),
)

MINI_SWE_AGENT = HarnessSpec(
    name="mini-swe-agent", version="2.4.6", kind="pip-venv", package="mini-swe-agent==2.4.6",
    prefix="/opt/mini-swe-agent", entry="/opt/mini-swe-agent/bin/mini --help",
)
CLAUDE_CODE = HarnessSpec(
    name="claude-code", version="2.1.332", kind="npm", package="@anthropic-ai/claude-code@2.1.332",
    prefix="/opt/claude-code", entry="/opt/claude-code/bin/claude --version", apt=("nodejs",),
)


def small() -> CorpusSpec:
    return CorpusSpec(
        flavor="small", os_packages=BASE_PACKAGES, repos=(MORE_ITERTOOLS,), harnesses=(MINI_SWE_AGENT,),
        tasks_per_repo=4, candidates_per_repo=16,
    )


def full() -> CorpusSpec:
    return CorpusSpec(
        flavor="full", os_packages=BASE_PACKAGES + BUILD_PACKAGES,
        repos=(MORE_ITERTOOLS, TOOLZ, ATTRS, PACKAGING, BOLTONS),
        harnesses=(MINI_SWE_AGENT, CLAUDE_CODE), tasks_per_repo=8, candidates_per_repo=24,
    )


def get(flavor: str) -> CorpusSpec:
    if flavor == "small":
        return small()
    if flavor == "full":
        return full()
    raise ValueError(f"unknown corpus flavor {flavor!r} (small|full)")
