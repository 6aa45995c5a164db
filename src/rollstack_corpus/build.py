"""The realistic SWE corpus, built once and cached (its CLI is `rollstack bench corpus`).

Layout of a built corpus directory (default `<cache>/<flavor>`, cache = $ROLLSTACK_CORPUS_CACHE,
else /var/cache/rollstack/corpus as root, else ~/.cache/rollstack/corpus):

    os/                     Debian bookworm minbase + python3/pip/venv/git (+ build tools: full)
    repo-<name>/            diff over os: /work/<name> (sdist, git checkout) + test deps
    harness-<name>/         diff over os: /opt/<name> (venv or npm prefix) + its Debian packages
    evaluator/              diff over os: /opt/rollstack-eval (pinned pytest + scorer)
    tasks.jsonl             SWE-smith schema tasks, each checked in a chroot at build time
    manifest.json           components (group, base, bytes, files), task counts
    .stamps/<component>     cache keys: a component is rebuilt only when its inputs change

Diff trees keep overlayfs conventions (whiteouts are 0/0 character devices), exactly what
`rollstack group publish` converts.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from rollstack.errors import InvalidRequest, RuntimeFailure
from rollstack.tasks.model import Component, CorpusManifest, Task, dump_tasks, load_tasks
from rollstack.tasks.plans import EVAL_DIR
from rollstack_corpus import spec as corpus_spec
from rollstack_corpus.components import build_evaluator, build_harness, build_os, build_repo, check_harness
from rollstack_corpus.discovery import check_tasks, discover_tasks
from rollstack_corpus.spec import CorpusSpec, RepoSpec
from rollstack_corpus.tree import remove_tree, tree_stats

Log = Callable[[str], None]
EVALUATOR_LAYOUT = 2  # bump when the evaluator tree's layout changes (v2: pytest as a fallback)


def default_cache_dir() -> Path:
    env = os.environ.get("ROLLSTACK_CORPUS_CACHE")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/cache/rollstack/corpus")
    return Path.home() / ".cache" / "rollstack" / "corpus"


def corpus_dir(flavor: str, out: Path | None = None) -> Path:
    return out if out is not None else default_cache_dir() / flavor


def log_stderr(msg: str) -> None:
    """The default progress log: `[corpus] ...` lines on stderr."""
    print(f"[corpus] {msg}", file=sys.stderr, flush=True)


class _Stamps:
    """Per-component cache keys stored beside the trees."""

    def __init__(self, root: Path) -> None:
        self.dir = root / ".stamps"
        self.dir.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def peek(root: Path, name: str, key: str) -> bool:
        """Is `name` fresh under `key` (and, for the manifest, present), without creating anything."""
        p = root / ".stamps" / name
        ok = p.exists() and p.read_text().strip() == key
        return ok and (name != "manifest" or (root / "manifest.json").exists())

    def fresh(self, name: str, key: str) -> bool:
        p = self.dir / name
        return p.exists() and p.read_text().strip() == key

    def mark(self, name: str, key: str) -> None:
        (self.dir / name).write_text(key + "\n")

    def clear(self, name: str) -> None:
        (self.dir / name).unlink(missing_ok=True)


REQUIRED_TOOLS = ("debootstrap", "unshare", "chroot", "mount", "tar", "git")


def build_corpus(flavor: str = "small", out: Path | None = None, *, force: bool = False,
                 log: Log = log_stderr) -> CorpusManifest:
    """Build (or reuse) the corpus; returns its manifest. Idempotent: cached parts are skipped.

    Concurrent callers on the same directory serialise on `<root>/.lock`; the second one finds
    the corpus built and returns it."""
    spec = corpus_spec.get(flavor)
    root = corpus_dir(flavor, out)
    manifest_key = f"{spec.fingerprint('all')}:{_runner_hash()}"
    if not force and _Stamps.peek(root, "manifest", manifest_key):
        log(f"cached: {root}")
        return CorpusManifest.model_validate_json((root / "manifest.json").read_text())
    if os.geteuid() != 0:
        raise InvalidRequest("building a corpus needs root (debootstrap, chroot, overlay mounts)")
    missing = [t for t in REQUIRED_TOOLS if shutil.which(t) is None]
    if missing:
        raise InvalidRequest(f"building a corpus needs {', '.join(missing)} (see scripts/setup-system.sh)")
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and _Stamps.peek(root, "manifest", manifest_key):
            log(f"cached (built meanwhile): {root}")
            return CorpusManifest.model_validate_json((root / "manifest.json").read_text())
        return _build_locked(spec, root, manifest_key, force, log)


def _build_locked(spec: CorpusSpec, root: Path, manifest_key: str, force: bool, log: Log) -> CorpusManifest:
    flavor = spec.flavor
    stamps = _Stamps(root)
    scratch = root / ".scratch"
    remove_tree(scratch)
    t0 = time.monotonic()
    osfp = spec.os_fingerprint()
    os_tree = root / "os"
    if force or not stamps.fresh("os", osfp):
        log(f"os: debootstrap {corpus_spec.SUITE} minbase + {len(spec.os_packages)} packages")
        stamps.clear("os")
        build_os(os_tree, spec.os_packages, default_cache_dir() / "_debs", scratch)
        stamps.mark("os", osfp)

    def step(name: str, key: str, fn: Callable[[], None]) -> None:
        if not force and stamps.fresh(name, key):
            log(f"{name}: cached")
            return
        stamps.clear(name)
        t = time.monotonic()
        fn()
        stamps.mark(name, key)
        log(f"{name}: built in {time.monotonic() - t:.0f}s")

    def harness_job(h: corpus_spec.HarnessSpec) -> None:
        step(f"harness-{h.name}", f"{osfp}:{h}", lambda: _harness(os_tree, root, h, scratch, log))

    with ThreadPoolExecutor(max_workers=2) as pool:
        # Harness installs are network-bound; overlap them with the repository/task pipeline.
        futures = [pool.submit(harness_job, h) for h in spec.harnesses]
        step("evaluator", f"{osfp}:{spec.evaluator_pytest}:{EVALUATOR_LAYOUT}",
             lambda: build_evaluator(os_tree, root / "evaluator", spec.evaluator_pytest, scratch))
        all_tasks: list[Task] = []
        for repo in spec.repos:
            step(f"repo-{repo.name}", spec.repo_fingerprint(repo),
                 lambda r=repo: build_repo(os_tree, root / f"repo-{r.name}", r, scratch))
            step(f"tasks-{repo.name}", spec.tasks_fingerprint(repo) + ":" + _runner_hash(),
                 lambda r=repo: _tasks(os_tree, root, r, spec, scratch, log))
            all_tasks += load_tasks((root / f"tasks-{repo.name}.jsonl").read_text())
        for f in futures:
            f.result()
    n_per = {r.name: sum(t.repo == r.name for t in all_tasks) for r in spec.repos}
    min_tasks = 4 if flavor == "small" else 32
    if len(all_tasks) < min_tasks:
        raise RuntimeFailure(f"only {len(all_tasks)} checked tasks (want >= {min_tasks}): {n_per}")
    (root / "tasks.jsonl").write_text(dump_tasks(all_tasks))
    _install_task_files(root / "evaluator", all_tasks)
    manifest = CorpusManifest(
        flavor=spec.flavor, components=_components(root, spec), tasks=len(all_tasks),
        tasks_per_repo=n_per, build_seconds=round(time.monotonic() - t0, 1),
        built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    (root / "manifest.json").write_text(manifest.model_dump_json(indent=2))
    stamps.mark("manifest", manifest_key)
    remove_tree(scratch)
    log(f"done: {len(all_tasks)} tasks, {root}")
    return manifest


def _install_task_files(eval_tree: Path, tasks: list[Task]) -> None:
    """One JSON per task in the evaluator tree, so `score /opt/rollstack-eval/tasks/<id>.json` works."""
    d = eval_tree / EVAL_DIR.lstrip("/") / "tasks"
    remove_tree(d)
    d.mkdir(parents=True)
    for t in tasks:
        (d / f"{t.instance_id}.json").write_text(t.model_dump_json())


def code_key(source: bytes) -> bytes:
    """What of a module's source counts for a cache key: its syntax tree without docstrings
    (comments are not in it), so a documentation edit keys the same as before."""
    import ast

    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    return ast.dump(tree).encode()


def _runner_hash() -> str:
    """Task discovery/checking code is part of the tasks' cache key (its code, not its text)."""
    import hashlib

    from rollstack_corpus import bugs as corpus_bugs, runner as corpus_runner

    h = hashlib.sha256()
    for mod in (corpus_bugs, corpus_runner):
        h.update(code_key(Path(mod.__file__).read_bytes()))
    return h.hexdigest()[:12]


def _harness(os_tree: Path, root: Path, h: corpus_spec.HarnessSpec, scratch: Path, log: Log) -> None:
    tree = root / f"harness-{h.name}"
    build_harness(os_tree, tree, h, scratch / h.name)
    log(f"harness-{h.name}: `{h.entry}`: {check_harness(os_tree, tree, h, scratch / h.name)}")


def _tasks(os_tree: Path, root: Path, repo: RepoSpec, spec: CorpusSpec, scratch: Path, log: Log) -> None:
    repo_tree = root / f"repo-{repo.name}"
    tasks = discover_tasks(os_tree, repo_tree, repo, spec.tasks_per_repo + 2, spec.candidates_per_repo,
                           spec.max_fail_to_pass, scratch)
    verdicts = {v["instance_id"]: v for v in check_tasks(os_tree, repo_tree, root / "evaluator", tasks, scratch)}
    good = [t for t in tasks if verdicts.get(t.instance_id, {}).get("ok")]
    for t in tasks:
        if not verdicts.get(t.instance_id, {}).get("ok"):
            log(f"tasks-{repo.name}: dropped {t.instance_id}: {verdicts.get(t.instance_id, {}).get('reason') or 'check failed'}")
    good = good[: spec.tasks_per_repo]
    log(f"tasks-{repo.name}: {len(good)} checked tasks from {spec.candidates_per_repo} candidates")
    (root / f"tasks-{repo.name}.jsonl").write_text(dump_tasks(good))


def _components(root: Path, spec: CorpusSpec) -> list[Component]:
    comps: list[Component] = []

    def add(name: str, kind: str, group: str, base: str | None, info: dict[str, Any]) -> None:
        st = tree_stats(root / name)
        comps.append(Component(name=name, kind=kind, group=group, base=base, bytes=st.bytes, files=st.files,
                               whiteouts=st.whiteouts, info=info))

    add("os", "os", f"os/debian-python:{corpus_spec.SUITE}", None,
        {"packages": list(spec.os_packages), "suite": corpus_spec.SUITE})
    for r in spec.repos:
        add(f"repo-{r.name}", "repo", r.group, "os",
            {"workdir": r.workdir, "version": r.version, "test_command": r.test_command})
    for h in spec.harnesses:
        add(f"harness-{h.name}", "harness", h.group, "os", {"prefix": h.prefix, "entry": h.entry, "apt": list(h.apt)})
    add("evaluator", "evaluator", f"evaluator/pytest:{spec.evaluator_pytest}", "os",
        {"score": f"{EVAL_DIR}/score TASK.json"})
    return comps


def load_corpus(root: Path) -> tuple[CorpusManifest, list[Task]]:
    """A built corpus's manifest and tasks (InvalidRequest if it is not built)."""
    mf = root / "manifest.json"
    if not mf.exists():
        raise InvalidRequest(f"no corpus at {root} (run `rollstack bench corpus build`)")
    return CorpusManifest.model_validate_json(mf.read_text()), load_tasks((root / "tasks.jsonl").read_text())


def stack_summary(manifest: CorpusManifest) -> list[dict[str, Any]]:
    """Size of every os + repo + harness stack (what one environment holds)."""
    repos = [c for c in manifest.components if c.kind == "repo"]
    harnesses = [c for c in manifest.components if c.kind == "harness"]
    out = []
    for r in repos:
        for h in harnesses:
            names = ["os", r.name, h.name]
            out.append({"stack": names, "bytes": manifest.stack_bytes(names), "files": manifest.stack_files(names)})
    return out


def publish_corpus(root: Path, store_spec: str) -> list[dict[str, Any]]:
    """Publish every component as a layer group (needs `rollstack.plan.groups.publish_group`)."""
    try:
        from rollstack.plan.groups import publish_group  # owned by the packaging work
        from rollstack.store import open_store
    except ImportError as exc:
        raise InvalidRequest(f"group publishing is not available yet ({exc}); "
                             "publish each directory with `rollstack group publish`") from exc
    manifest, _ = load_corpus(root)
    store = open_store(store_spec)
    published = []
    try:
        for c in manifest.components:
            res = publish_group(store, c.group, [root / c.name], kind=c.kind)
            published.append({"component": c.name, "group": c.group,
                              "result": res.to_dict() if hasattr(res, "to_dict") else str(res)})
    finally:
        store.close()
    return published
