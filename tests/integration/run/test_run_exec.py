"""One exec behaviour suite, run on both paths (the in-sandbox agent and `runc exec`): exit codes,
stdin, env, cwd, streaming, timeouts, output caps."""

from __future__ import annotations

import time

import pytest

from rollstack.errors import EnvironmentGone, InvalidRequest

pytestmark = [pytest.mark.integration,
              pytest.mark.parametrize("exec_mode", ["agent", "agent-async", "runc"], indirect=True)]


def test_exec_basics(make_env):
    env = make_env(cwd="/work", env={"FROM_SPEC": "spec"})
    r = env.exec(["echo", "hello"])
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out, r.truncated) == \
        (0, b"hello\n", b"", False, False)
    r = env.exec("echo out; echo err >&2; exit 7")
    assert (r.exit_code, r.stdout, r.stderr) == (7, b"out\n", b"err\n")
    assert env.exec(["cat"], stdin=b"some input\x00bytes").stdout == b"some input\x00bytes"
    assert env.exec("pwd").stdout == b"/work\n"
    assert env.exec("pwd", cwd="/bin").stdout == b"/bin\n"
    r = env.exec("echo $FROM_SPEC $EXTRA", env={"EXTRA": "x y"})
    assert r.stdout == b"spec x y\n"
    # exec env overrides the spec's (runc dedups, last wins), once
    r = env.exec("echo $FROM_SPEC; cat /proc/self/environ | tr '\\0' '\\n' | grep -c ^FROM_SPEC=",
                 env={"FROM_SPEC": "override"})
    assert r.stdout == b"override\n1\n"
    r = env.exec(["/no/such/binary"])
    assert r.exit_code == 127 and b"No such file" in r.stderr
    assert env.exec("kill -9 $$").exit_code == 137
    assert r.duration > 0


def test_large_stdin_and_output_do_not_deadlock(make_env):
    env = make_env()
    data = bytes(range(256)) * 8192  # 2 MiB both ways at once
    r = env.exec(["cat"], stdin=data)
    assert r.exit_code == 0 and r.stdout == data


def test_streaming_callback_sees_chunks_in_order(make_env):
    env = make_env()
    seen: list[tuple[str, bytes, float]] = []
    r = env.exec("echo one; sleep 0.5; echo two >&2; sleep 0.5; echo three",
                 on_output=lambda s, c: seen.append((s, c, time.monotonic())))
    assert r.exit_code == 0
    out = b"".join(c for s, c, _ in seen if s == "stdout")
    assert out == r.stdout == b"one\nthree\n"
    assert [c for s, c, _ in seen if s == "stderr"] == [b"two\n"]
    # 'one' arrived well before the command ended: streamed, not buffered to the end
    assert seen[-1][2] - seen[0][2] > 0.5


def test_timeout_kills_the_whole_tree(make_env):
    env = make_env()
    r = env.exec("sleep 300 & (sleep 301 &) ; (setsid sleep 302 &); echo started; sleep 303",
                 timeout=1.5)
    assert r.timed_out and r.exit_code == 124
    assert r.stdout == b"started\n"
    ps = env.exec(["ps", "-o", "pid,args"]).stdout.decode()
    assert "sleep 30" not in ps, ps


def test_output_cap_flags_truncation(make_env):
    env = make_env()
    r = env.exec("head -c 300000 /dev/zero; echo tail >&2", output_limit=100_000)
    assert r.truncated and len(r.stdout) == 100_000 and r.stderr == b"tail\n"
    assert r.exit_code == 0


def test_background_process_holding_stdout_does_not_block(make_env):
    env = make_env()
    start = time.monotonic()
    r = env.exec("sleep 600 & echo bg")
    assert r.exit_code == 0 and r.stdout == b"bg\n"
    assert time.monotonic() - start < 300  # did not wait for the background sleep


def test_exec_validation_and_gone(make_env, wait_stopped):
    env = make_env()
    with pytest.raises(InvalidRequest):
        env.exec([])
    with pytest.raises(InvalidRequest):
        env.exec("true", timeout=0)
    env.runtime.runc.kill(env.id, "KILL")
    wait_stopped(env)
    with pytest.raises(EnvironmentGone):
        env.exec("true")


def test_bad_cwd_is_the_callers_error(make_env):
    env = make_env()
    with pytest.raises(InvalidRequest, match="nonexistent"):
        env.exec("true", cwd="/nonexistent")
    with pytest.raises(InvalidRequest):
        env.exec("true", cwd="relative")
    with pytest.raises(InvalidRequest):
        env.exec("true", env={"A=B": "x"})


def test_callback_error_still_kills_the_command(make_env):
    env = make_env()

    def explode(stream: str, chunk: bytes) -> None:
        raise RuntimeError("consumer went away")

    with pytest.raises(RuntimeError):
        env.exec("echo first; sleep 300", on_output=explode)
    assert b"sleep 300" not in env.exec(["ps", "-o", "args"]).stdout


def test_no_zombies_accumulate(make_env):
    env = make_env()
    for _ in range(3):
        env.exec("sleep 0.1 & true")
        env.exec("(sleep 0.1 &) ; true")
    time.sleep(0.3)
    ps = env.exec(["ps", "-o", "stat,args"]).stdout.decode().splitlines()[1:]
    assert not [line for line in ps if line.startswith("Z")], ps


def test_oversized_command_is_invalid(make_env):
    env = make_env()
    with pytest.raises(InvalidRequest):
        env.exec(["echo", "x" * (4 * 1024 * 1024)])
