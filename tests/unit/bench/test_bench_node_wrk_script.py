"""`bench node`'s wrk load: the script it writes and the result line it reads (pure)."""

from __future__ import annotations

import pytest

from rollstack_bench.node_wrk import lua_script, parse_result
from rollstack.errors import InvalidRequest, RuntimeFailure


def test_script_posts_exec_round_robin_with_the_token() -> None:
    s = lua_script(["e1", "e2"], "tok-en_1")
    assert 'local ids = {"e1", "e2"}' in s
    assert 'wrk.headers["Authorization"] = "Bearer tok-en_1"' in s
    assert "wrk.body = '{\"argv\": [\"true\"]}'" in s
    assert '"/v1/environments/" .. ids[i] .. "/exec"' in s


@pytest.mark.parametrize("ids,token", [([], "t"), (['e1"; os.exit()'], "t"), (["e1"], "t\"x"),
                                       (["e1"], "a b"), (["../x/"], "t")])
def test_script_refuses_what_it_would_have_to_quote(ids: list[str], token: str) -> None:
    with pytest.raises(InvalidRequest):
        lua_script(ids, token)


def test_argv_with_quotes_stays_one_lua_string() -> None:
    s = lua_script(["e1"], "t", argv=["sh", "-c", "echo 'a\\b'"])
    body = s.split("wrk.body = ", 1)[1].split("\n", 1)[0]
    assert body.startswith("'") and body.endswith("'") and "\\'" in body


def test_result_line_is_parsed() -> None:
    out = "Running 3s test @ http://127.0.0.1:1\n  ...\nROLLSTACK_WRK 1500 3000000 2 1 4000 9000 20000\n"
    r = parse_result(out)
    assert r["requests"] == 1500 and r["execs_per_s"] == 500.0 and r["seconds"] == 3.0
    assert r["non_2xx"] == 2 and r["socket_errors"] == 1
    assert r["p50"] == 0.004 and r["p99"] == 0.009 and r["max"] == 0.02


@pytest.mark.parametrize("out", ["", "ROLLSTACK_WRK 1 2 3", "ROLLSTACK_WRK a b c d e f g"])
def test_a_missing_or_garbled_result_is_an_error(out: str) -> None:
    with pytest.raises(RuntimeFailure):
        parse_result(out)
