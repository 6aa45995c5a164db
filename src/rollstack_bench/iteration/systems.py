"""How each system of `bench iteration` runs one rollout: a rollstack node (`rollstack_rollout`,
`rollstack_plan`) and the docker-equivalent on containerd (`ContainerdRollouts`)."""

from __future__ import annotations

import itertools
import os
import shlex
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable

from rollstack_bench.iteration.rollout import PhaseClock, Rollout, agent_steps, heredoc
from rollstack_bench.systems.rollstack import on_fuse_lowers
from rollstack.errors import RollstackError
from rollstack.tasks.plans import EVAL_DIR



# -- rollstack -----------------------------------------------------------------------------------

def retry_capacity(fn: Callable[[], Any], *, attempts: int = 60, delay: float = 0.5,
                   sleep: Callable[[float], None] = time.sleep) -> Any:
    """Call `fn`, retrying while the node answers insufficient_capacity (its quotas are all handed
    out to the rollouts in flight): the wait counts in the phase, as it would for a trainer."""
    for i in range(attempts):
        try:
            return fn()
        except RollstackError as exc:
            if exc.code != "insufficient_capacity" or i == attempts - 1:
                raise
            sleep(min(delay * (1.5 ** i), 5.0))
    raise AssertionError("unreachable")


def rollstack_rollout(node: Any, plan: dict[str, Any], task: dict[str, Any], k: int, entry: str, t0: float) -> Rollout:
    return run_rollout(node, plan, task["instance_id"], k, agent_steps(task, entry), t0)


def run_rollout(node: Any, plan: dict[str, Any], task_id: str, k: int, steps: list[tuple[str, str, str | None]],
                t0: float, *, failed_eval_is_error: bool = False) -> Rollout:
    """One rollout on a rollstack node: create `plan`, run `steps` (name, shell command, stdin),
    evaluate, destroy; every phase and step timed."""
    rec = Rollout("rollstack", task_id, k)
    clock = PhaseClock(rec, t0)
    env = None
    try:
        env = clock.run("init", lambda: retry_capacity(lambda: node.create(plan)))
        rec.fetched_bytes = int(env.created.fetch.fetched_bytes)
        rec.fuse_lowers = on_fuse_lowers(env.id)

        def agent() -> None:
            for name, cmd, stdin in steps:
                t = time.perf_counter()
                rec.steps[name] = env.exec(cmd, timeout=600, stdin=stdin).exit_code
                rec.step_s[name] = time.perf_counter() - t

        clock.run("exec", agent)
        ev = clock.run("eval", lambda: retry_capacity(env.evaluate))
        rec.reward = float(ev.reward)
        rec.eval_env_init_s = float(ev.timings.get("create", 0.0))
        rec.eval_cmd_s = float(ev.timings.get("run", 0.0))
        if failed_eval_is_error and ev.reward != 1.0:
            rec.error = f"evaluation failed (exit {ev.exit_code}): {ev.output[-300:]}"
    except RollstackError as exc:
        rec.error = f"{exc.code}: {exc.message or exc.code}"
    except Exception as exc:  # noqa: BLE001 - recorded; the run reports errors
        rec.error = f"{type(exc).__name__}: {exc}"
    finally:
        if env is not None:
            try:
                clock.run("destroy", env.destroy)
            except Exception as exc:  # noqa: BLE001
                rec.error = rec.error or f"destroy_failed: {exc}"
    return rec


def rollstack_plan(task: dict[str, Any], groups: Any, k: int) -> dict[str, Any]:
    """demo's rollout plan, its evaluator scoring the task file installed in the evaluator group."""
    from rollstack.tasks.plans import rollout_plan

    return rollout_plan(task, groups, k, evaluator=[f"{EVAL_DIR}/score", f"{EVAL_DIR}/tasks/{task['instance_id']}.json"])


# -- docker-equivalent ---------------------------------------------------------------------------

class CtrRollouts:
    """What every docker-equivalent rollout does on the bench rig's containerd: pull an image once
    (concurrent rollouts wait for it), run a command in a running container, tear containers down."""

    _ids = itertools.count()

    def __init__(self, ctr: Any) -> None:
        self.ctr = ctr
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _names(self) -> tuple[str, str]:
        """(rollout container, evaluator container) names, unique in this process."""
        n = next(self._ids)
        return f"rsi-{os.getpid()}-{n}", f"rsi-{os.getpid()}-{n}-eval"

    def _start_idle(self, ref: str, cid: str) -> None:
        """A long-running container (`sleep infinity`) of `ref` to exec the agent's steps in."""
        self._ensure_image(ref)
        self.ctr.create(ref, cid, ["sleep", "infinity"])
        self.ctr.run("tasks", "start", "-d", cid)

    def _destroy(self, *cids: str) -> None:
        for c in cids:
            self.ctr.run("tasks", "kill", "-s", "SIGKILL", c, check=False)
            self.ctr.delete(c)

    def _steps(self, rec: Rollout, cid: str, workdir: str, steps: list[tuple[str, str, str | None]]) -> None:
        """The agent: each (name, shell command, stdin) as `ctr tasks exec`, exit code and time kept."""
        for name, cmd, stdin in steps:
            t = time.perf_counter()
            rec.steps[name] = self._exec(cid, workdir, cmd, stdin).returncode
            rec.step_s[name] = time.perf_counter() - t

    def _phases(self, rec: Rollout, clock: PhaseClock, init: Callable[[], None], agent: Callable[[], None],
                evaluate: Callable[[], float], cids: tuple[str, ...]) -> Rollout:
        """init -> exec -> eval (its reward) -> destroy `cids`; an exception is the rollout's error."""
        try:
            clock.run("init", init)
            clock.run("exec", agent)
            rec.reward = clock.run("eval", evaluate)
        except Exception as exc:  # noqa: BLE001 - recorded; the run reports errors
            rec.error = f"{type(exc).__name__}: {str(exc)[-300:]}"
        finally:
            clock.run("destroy", lambda: self._destroy(*cids))
        return rec

    def _ensure_image(self, ref: str) -> None:
        with self._guard:
            lock = self._locks.setdefault(ref, threading.Lock())
        with lock:  # one pull per image; the others wait for it (docker dedupes concurrent pulls too)
            if not self.ctr.has_image(ref):
                self.ctr.pull(ref)

    def _exec(self, cid: str, workdir: str, cmd: str, stdin: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        script = heredoc(f"cd {shlex.quote(workdir)} && {cmd}", stdin)
        argv = self.ctr._cmd("tasks", "exec", "--exec-id", f"x{next(self._ids)}", cid, "/bin/sh", "-c", script)
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


class ContainerdRollouts(CtrRollouts):
    """docker-equivalent rollouts of corpus tasks (see the package docstring)."""

    def __init__(self, ctr: Any, images: dict[str, Any], stacks: dict[str, Any], eval_dir: Path) -> None:
        super().__init__(ctr)
        self.images, self.stacks, self.eval_dir = images, stacks, eval_dir

    def rollout(self, task: dict[str, Any], k: int, entry: str, t0: float) -> Rollout:
        rec = Rollout("docker-equivalent", task["instance_id"], k)
        clock = PhaseClock(rec, t0)
        stack = self.stacks[task["repo"]]
        ref = self.images[stack.name].bundled
        cid, eval_cid = self._names()
        wd = task["workdir"]

        def init() -> None:
            self._start_idle(ref, cid)
            p = self._exec(cid, wd, "git apply -", task["patch"])
            if p.returncode != 0:
                raise RuntimeError(f"mutation failed: {p.stderr[-300:]}")

        def evaluate() -> float:
            diff = self._exec(cid, wd, "git diff --binary HEAD").stdout
            apply = heredoc("git apply -", diff) if diff.strip() else "true"
            script = (f"cd {shlex.quote(wd)} && {apply.rstrip()}\n"
                      f"exec {EVAL_DIR}/score {EVAL_DIR}/tasks/{task['instance_id']}.json\n")
            t = time.perf_counter()
            self.ctr.create(ref, eval_cid, ["/bin/sh", "-c", script], [(str(self.eval_dir), EVAL_DIR)])
            rec.eval_env_init_s = time.perf_counter() - t
            return 1.0 if self.ctr.start(eval_cid).returncode == 0 else 0.0

        return self._phases(rec, clock, init, lambda: self._steps(rec, cid, wd, agent_steps(task, entry)), evaluate,
                            (cid, eval_cid))
