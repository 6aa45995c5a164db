"""The agent's test command never runs a stale .pyc: a same-size fix applied within the second
of the first run (its .pyc records the source's mtime in whole seconds and its size) still runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rollstack.tasks.plans import failing_tests_command


TASK = {"instance_id": "mod.1.op_swap__0", "repo": "mod", "FAIL_TO_PASS": ["tests/test_mod.py::test_value"]}


def test_a_same_size_fix_in_the_same_second_is_what_runs(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests/test_mod.py").write_text("from mod import value\n\ndef test_value():\n    assert value() == 1\n")
    mod = tmp_path / "mod.py"
    mod.write_text("def value():\n    return 2\n")  # the bug
    stamp = 1_700_000_000
    os.utime(mod, (stamp, stamp))
    # as inside an environment: bytecode is written unless the command says otherwise
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", PYTHONPATH=str(tmp_path))
    cmd = failing_tests_command(TASK)
    before = subprocess.run(cmd, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert before.returncode == 1, before.stdout + before.stderr
    mod.write_text("def value():\n    return 1\n")  # the fix: same size, same second
    os.utime(mod, (stamp, stamp))
    after = subprocess.run(cmd, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert after.returncode == 0, after.stdout + after.stderr
    # and the hazard is real: the same two runs without -B run the stale bytecode
    plain = cmd.replace("python3 -B ", "python3 ")
    mod.write_text("def value():\n    return 2\n")
    os.utime(mod, (stamp + 10, stamp + 10))
    assert subprocess.run(plain, shell=True, cwd=tmp_path, env=env, capture_output=True).returncode == 1
    mod.write_text("def value():\n    return 1\n")
    os.utime(mod, (stamp + 10, stamp + 10))
    assert subprocess.run(plain, shell=True, cwd=tmp_path, env=env, capture_output=True).returncode == 1  # stale
