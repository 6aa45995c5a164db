"""`bench iteration --image` (pure): the tasks of an imported image, the agent's steps, and the
report's math (per-phase and per-command medians, rollstack / containerd ratios).

A task is the image plus a small mutation: a generated file `TASK_DIR/task.txt` (a new-file diff,
what the rollout's environment starts with). A rollout runs the agent-like steps in TASK_DIR —
by default `true` (the exec path alone), a file walk (`find /usr -xdev | wc -l`), the image's command (`--command`: imports of
its packages, its tests), reading a few thousand source files, a CPU-bound step — and always
ends with the write the evaluation checks (`sha256sum task.txt > result.sha256`). The evaluation
runs in a second, clean environment of the image with the rollout's changes carried over:
`sha256sum -c result.sha256` and then the eval command (default: the image's command again, like
rerunning the tests). Reward 1.0 iff it exits 0.
"""

from __future__ import annotations

import hashlib
import shlex
import statistics
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from rollstack.errors import InvalidRequest

TASK_DIR = "/rollstack-task"
TASK_FILE = "task.txt"
RESULT_FILE = "result.sha256"
WRITE_STEP = ("write", f"sha256sum {TASK_FILE} > {RESULT_FILE}")
"""the last step of every rollout: the answer the evaluation checks"""

NOOP_STEP = "noop"
"""`true`: the exec path alone (rollstack's exec API vs a `ctr tasks exec` client), which every
other step's time includes; `ratios` also gives each step's ratio net of it"""
DEFAULT_STEPS: tuple[tuple[str, str], ...] = (
    (NOOP_STEP, "true"),
    ("walk", "find /usr -xdev | wc -l"),
    ("command", ""),  # the image's --command
    ("read", "find /usr -xdev -type f \\( -name '*.py' -o -name '*.js' -o -name '*.h' \\) 2>/dev/null "
             "| sort | head -n 3000 | xargs -r cat | wc -c"),
    ("cpu", "head -c 100000000 /dev/zero | sha256sum"),
)
"""(step, shell command) of the default agent; `command` is filled with the image's command"""


def image_label(ref: str) -> str:
    """A short name of an image reference (its last path part, tag dropped): python-project."""
    from rollstack_bench.init_image import image_name

    return image_name(ref).removeprefix("bench-image/")


def known_command(ref: str) -> str | None:
    """The command `bench.images` gives a bench image (python-project, node-project, swe-project)
    when `ref` is one of its layouts, else None."""
    from rollstack_bench.images import IMAGES

    spec = IMAGES.get(image_label(ref))
    if spec is None or not ref.startswith("oci:"):
        return None
    return spec.command


def image_commands(images: Sequence[str], commands: Sequence[str]) -> list[str]:
    """One command per image: `--command` given once (for every image) or once per image (in
    order); an image without one gets its bench-image command."""
    if not images:
        raise InvalidRequest("--image: give at least one image")
    if len(commands) not in (0, 1, len(images)):
        raise InvalidRequest(f"--command: give it once or once per --image ({len(images)}), not {len(commands)} times")
    out = []
    for i, ref in enumerate(images):
        cmd = commands[i if len(commands) > 1 else 0] if commands else known_command(ref)
        if not cmd or not cmd.strip():
            raise InvalidRequest(f"--command: {ref} is not one of bench.images' images; say what to run in it")
        out.append(cmd)
    labels = [image_label(r) for r in images]
    if len(set(labels)) != len(labels):
        raise InvalidRequest(f"--image: two images share a name ({labels}); rename one layout")
    return out


def agent_steps(command: str, task_commands: Sequence[str] = ()) -> list[tuple[str, str]]:
    """(step, shell command run in TASK_DIR): `task_commands` (step-1, step-2, ...) or the
    default steps with `command`; the write step last."""
    if task_commands:
        steps = [(f"step-{i + 1}", c) for i, c in enumerate(task_commands)]
    else:
        steps = [(name, command if name == "command" else cmd) for name, cmd in DEFAULT_STEPS]
    for name, cmd in steps:
        if not cmd.strip():
            raise InvalidRequest(f"agent step {name} has an empty command")
    return [*steps, WRITE_STEP]


def task_text(instance_id: str, image: str) -> str:
    """The generated file of a task (deterministic: a digest per task, ~4 KiB)."""
    seed = hashlib.sha256(f"{image}\n{instance_id}".encode()).hexdigest()
    lines = [f"task {instance_id}", f"image {image}"]
    lines += [f"{i:03d} {hashlib.sha256(f'{seed}{i}'.encode()).hexdigest()}" for i in range(60)]
    return "\n".join(lines) + "\n"


def new_file_diff(path: str, text: str) -> str:
    """A git-style diff creating `path` (relative) with `text` (ends with a newline)."""
    if not text.endswith("\n") or Path(path).is_absolute():
        raise InvalidRequest("new_file_diff: a relative path and text ending with a newline")
    lines = text.splitlines(keepends=True)
    return (f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
            f"@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{ln}" for ln in lines))


def eval_script(eval_command: str) -> str:
    """The evaluator's shell command (cwd TASK_DIR): the answer checked, then `eval_command`."""
    return f"cd {TASK_DIR} && sha256sum -c {RESULT_FILE} >/dev/null && {eval_command}"


def make_tasks(images: Sequence[str], commands: Sequence[str], n_per_image: int,
               task_commands: Sequence[str] = (), eval_command: str | None = None) -> list[dict[str, Any]]:
    """`n_per_image` tasks per image (`repo` = the image's label, so `rollout.jobs` spreads a
    batch over the images)."""
    if n_per_image < 1:
        raise InvalidRequest("--tasks must be >= 1")
    out = []
    for ref, cmd in zip(images, image_commands(images, commands)):
        label = image_label(ref)
        for i in range(n_per_image):
            iid = f"{label}-{i}"
            text = task_text(iid, ref)
            out.append({"instance_id": iid, "repo": label, "image": ref, "workdir": TASK_DIR,
                        "text": text, "mutation": new_file_diff(f"{TASK_DIR.lstrip('/')}/{TASK_FILE}", text),
                        "steps": agent_steps(cmd, task_commands),
                        "eval": eval_script(eval_command or cmd)})
    return out


def in_task_dir(cmd: str) -> str:
    return f"cd {shlex.quote(TASK_DIR)} && {cmd}"


# -- the report's math ---------------------------------------------------------------------------

def _median(xs: Iterable[float]) -> float:
    v = list(xs)
    return statistics.median(v) if v else float("nan")


def phase_medians(rollouts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Medians (s) over rollouts without an error: init, exec and eval phases, the evaluator's
    environment init and command, and each step keyed `<image>:<step>` (the task id's image);
    `fuse_lowers`: how many of them ran on FUSE lowers (rollstack)."""
    ok = [r for r in rollouts if not r.get("error")]

    def dur(r: Mapping[str, Any], name: str) -> float:
        return sum(p["end"] - p["start"] for p in r.get("phases", []) if p["name"] == name)

    steps: dict[str, list[float]] = {}
    for r in ok:
        label = str(r["task"]).rsplit("-", 1)[0]
        for name, s in r.get("step_s", {}).items():
            steps.setdefault(f"{label}:{name}", []).append(float(s))
    return {"fuse_lowers": sum(1 for r in ok if r.get("fuse_lowers")),
            "init_p50": _median(dur(r, "init") for r in ok), "exec_p50": _median(dur(r, "exec") for r in ok),
            "eval_p50": _median(dur(r, "eval") for r in ok),
            "eval_env_init_p50": _median(float(r.get("eval_env_init_s", 0.0)) for r in ok),
            "eval_cmd_p50": _median(float(r.get("eval_cmd_s", 0.0)) for r in ok),
            "steps_p50": {k: _median(v) for k, v in sorted(steps.items())}}


def _ratio(a: float | None, b: float | None) -> float:
    if a is None or b is None or a != a or b != b or b <= 0:
        return float("nan")
    return a / b


RATIO_KEYS = ("iteration_s", "init_p50", "exec_p50", "eval_p50", "eval_cmd_p50")


def ratios(rs: Mapping[str, Any], ctd: Mapping[str, Any]) -> dict[str, Any]:
    """rollstack / containerd for the iteration wall, the phase medians and each step's median
    (< 1: rollstack faster); `steps_net`: each step's median minus its image's `noop` median on
    both sides (the command without the exec path), where both differences are positive."""
    out: dict[str, Any] = {k: _ratio(rs.get(k), ctd.get(k)) for k in RATIO_KEYS}
    a, b = rs.get("steps_p50", {}), ctd.get("steps_p50", {})
    common = sorted(set(a) & set(b))
    out["steps"] = {k: _ratio(a[k], b[k]) for k in common}
    net = {}
    for k in common:
        label, step = k.rsplit(":", 1)
        noop = f"{label}:{NOOP_STEP}"
        if step != NOOP_STEP and noop in a and noop in b:
            da, db = a[k] - a[noop], b[k] - b[noop]
            net[k] = _ratio(da, db) if da > 0 else float("nan")
    out["steps_net"] = net
    return out
