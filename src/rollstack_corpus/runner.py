"""Test runner that runs INSIDE corpus trees (stdlib only, Python >= 3.9): a pytest plugin + CLI.

This file is copied into chroots and into the evaluator tree (`/opt/rollstack-eval/`), so it
must not import rollstack. Three roles:

- pytest plugin (`PYTEST_ADDOPTS="-p corpus_runner"`, `RS_RESULTS=FILE`): writes
  `{nodeid: outcome}` (passed/failed/skipped/xfailed/error) when the session ends;
- `discover SPEC OUT`: run the tests on the clean tree, then once per candidate mutation (file
  rewritten, run, restored); used to learn which tests each bug breaks;
- `check TASKS OUT`: for each task, `git apply` the bug, score, `git apply -R`, score again;
- `score TASK`: the evaluator: run the task's test command, reward 1.0 iff every FAIL_TO_PASS and
  PASS_TO_PASS test passes; prints one JSON document.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

_results = {}


def pytest_runtest_logreport(report):
    nid = report.nodeid
    if report.failed:
        _results[nid] = "failed" if report.when == "call" else "error"
    elif report.skipped:
        if getattr(report, "wasxfail", None) is not None:
            _results[nid] = "xfailed"
        else:
            _results.setdefault(nid, "skipped")
    elif report.when == "call" and _results.get(nid) not in ("failed", "error"):
        _results[nid] = "passed"


def pytest_collectreport(report):
    if report.failed:
        _results["<collect>:" + report.nodeid] = "error"


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("RS_RESULTS")
    if path:
        with open(path, "w") as f:
            json.dump(_results, f)


def _limit_memory(limit):
    def apply():
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return apply


def run_tests(workdir, command, timeout=600.0, memory=4 << 30):
    """Run `command` (shell) in workdir with this plugin; returns (exit code, {nodeid: outcome}).

    A mutation can turn a loop infinite or a list unbounded: the run gets its own process group
    (killed whole on timeout, exit code -9) and an address-space cap."""
    import signal

    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    env = dict(os.environ)
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTEST_ADDOPTS"] = (env.get("PYTEST_ADDOPTS", "") + " -p corpus_runner").strip()
    env["RS_RESULTS"] = out
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    proc = subprocess.Popen(command, shell=True, cwd=workdir, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=_limit_memory(memory) if memory else None)
    try:
        code = proc.wait(timeout=timeout)
        try:
            with open(out) as f:
                results = json.load(f)
        except (OSError, ValueError):
            results = {}
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        code, results = -9, {}
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # stragglers the tests left behind
        except OSError:
            pass
        os.unlink(out)
    return code, results


def score(task, timeout=600.0):
    """The evaluator verdict for `task` (a dict in the SWE-smith schema) on the current tree."""
    t0 = time.monotonic()
    code, results = run_tests(task["workdir"], task["test_command"], timeout)
    f2p = {t: results.get(t, "missing") for t in task["FAIL_TO_PASS"]}
    p2p = {t: results.get(t, "missing") for t in task.get("PASS_TO_PASS", [])}
    ok = all(v == "passed" for v in f2p.values()) and all(v == "passed" for v in p2p.values())
    return {
        "instance_id": task["instance_id"], "reward": 1.0 if ok else 0.0, "exit_code": code,
        "fail_to_pass": f2p, "pass_to_pass_failed": sorted(t for t, v in p2p.items() if v != "passed"),
        "seconds": round(time.monotonic() - t0, 3),
    }


def _purge_pyc(path):
    cache = os.path.join(os.path.dirname(path), "__pycache__")
    stem = os.path.splitext(os.path.basename(path))[0] + "."
    if os.path.isdir(cache):
        for name in os.listdir(cache):
            if name.startswith(stem):
                os.unlink(os.path.join(cache, name))


def discover(spec):
    workdir, command = spec["workdir"], spec["test_command"]
    t0 = time.monotonic()
    code, base = run_tests(workdir, command, spec.get("timeout", 600))
    # A bug that makes the tests 5x slower than clean (or hang) is not a usable task.
    limit = max(20.0, 5 * (time.monotonic() - t0))
    out = {"baseline": {"exit_code": code, "results": base}, "candidates": {}}
    for cand in spec["candidates"]:
        path = os.path.join(workdir, cand["path"])
        with open(path) as f:
            original = f.read()
        try:
            with open(path, "w") as f:
                f.write(cand["mutated"])
            _purge_pyc(path)
            code, res = run_tests(workdir, cand.get("test_command", command), limit)
        finally:
            with open(path, "w") as f:
                f.write(original)
            _purge_pyc(path)
        out["candidates"][cand["id"]] = {"exit_code": code, "results": res if code != -9 else {}}
    return out


def _git_apply(workdir, patch, reverse=False):
    args = ["git", "apply"] + (["-R"] if reverse else [])
    proc = subprocess.run(args, cwd=workdir, input=patch.encode(), capture_output=True)
    return proc.returncode, proc.stderr.decode(errors="replace")


def check(tasks):
    verdicts = []
    for task in tasks:
        v = {"instance_id": task["instance_id"]}
        code, err = _git_apply(task["workdir"], task["patch"])
        if code != 0:
            v.update(ok=False, reason="patch does not apply: " + err.strip())
            verdicts.append(v)
            continue
        buggy = score(task)
        code, err = _git_apply(task["workdir"], task["patch"], reverse=True)
        fixed = score(task) if code == 0 else None
        bug_breaks = all(s != "passed" for s in buggy["fail_to_pass"].values()) and not buggy["pass_to_pass_failed"]
        v.update(
            ok=bool(bug_breaks and fixed and fixed["reward"] == 1.0),
            buggy=buggy, fixed=fixed,
            reason="" if code == 0 else "fix does not apply: " + err.strip(),
        )
        verdicts.append(v)
    return verdicts


def main(argv):
    if len(argv) >= 3 and argv[0] == "discover":
        with open(argv[1]) as f:
            doc = discover(json.load(f))
        with open(argv[2], "w") as f:
            json.dump(doc, f)
        return 0
    if len(argv) >= 3 and argv[0] == "check":
        with open(argv[1]) as f:
            tasks = [json.loads(line) for line in f if line.strip()]
        with open(argv[2], "w") as f:
            json.dump(check(tasks), f)
        return 0
    if len(argv) >= 2 and argv[0] == "score":
        with open(argv[1]) as f:
            task = json.load(f)
        verdict = score(task)
        sys.stdout.write(json.dumps(verdict) + "\n")
        return 0 if verdict["reward"] == 1.0 else 1
    sys.stderr.write("usage: corpus_runner.py discover SPEC OUT | check TASKS OUT | score TASK\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
