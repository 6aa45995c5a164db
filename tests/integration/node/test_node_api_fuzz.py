"""The node API fuzzed from its own OpenAPI document (issue 35: bad input and failure).

A real node (runc, overlayfs, the lazy store) over the busybox corpus, with live environments:
every operation of `/openapi.json` gets schemathesis-generated requests, valid and invalid by the
schema, authenticated with the node's token; `{env_id}` is often a live environment's id and the
files API's `path` often a canary directory on the host (directly, climbing with `..`, through
/proc, through symlinks planted in the environment). Every answer must be documented and not a
5xx, and the server must log no error. Afterwards: the node is healthy, the environments still
work, the canary is untouched, nothing new appeared under the node root outside its per-env and
cache directories, and (serve_node) nothing is left after stop, by node doctor's count too.

`ROLLSTACK_FUZZ_EXAMPLES` scales the run (tests/fuzz_helpers.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from fuzz_helpers import EXAMPLES, Canary, ServerErrors, fuzz_operations, tree_snapshot
from node_helpers import plan, remember, serve_node

pytestmark = pytest.mark.integration
TOKEN = "fuzz-node-token"
NODE_OWN = ("envs", "lazy", "runc", "runc-exec", "node-envs", "erofs", "layers", "resolve-cache", "forks", "volumes")
"""Top-level entries of the node root that hold per-environment state, caches (layers are
materialized in the background while the fuzzer runs) and volumes (the fuzzer makes and writes
them: inside a volume is inside)."""
EXEC_TIMEOUT = 5.0
"""Longest exec the fuzzer may ask for (random commands must not hold the run)."""


@pytest.fixture(scope="module")
def node(corpus: str, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("fuzz-node-root")
    with serve_node(root, corpus, TOKEN, max_environments=8, reap_interval=0.5) as (service, server):
        yield service, server, root


def _http(server) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)


def _create(http: httpx.Client, root: Path) -> str:
    r = http.post("/v1/environments", json={"plan": plan()})
    assert r.status_code == 201, r.text
    env_id = r.json()["id"]
    remember(root, env_id)
    return env_id


def _sh(http: httpx.Client, env_id: str, command: str) -> dict:
    r = http.post(f"/v1/environments/{env_id}/exec", json={"command": command, "timeout": 30})
    assert r.status_code == 200, r.text
    return r.json()


def _bound_exec(case) -> None:
    """An exec runs at most EXEC_TIMEOUT seconds (when its body is an object at all)."""
    if case.operation.path.endswith(("/exec", "/exec/stream")) and isinstance(case.body, dict):
        t = case.body.get("timeout")
        if t is None or (isinstance(t, (int, float)) and not isinstance(t, bool) and t > EXEC_TIMEOUT):
            case.body["timeout"] = EXEC_TIMEOUT


def test_fuzzing_the_node_api_finds_no_server_error_and_writes_nothing_outside_environments(
        node, tmp_path_factory: pytest.TempPathFactory) -> None:
    import schemathesis

    service, server, root = node
    canary = Canary.make(tmp_path_factory.mktemp("fuzz-canary"))
    with _http(server) as http:
        stable = [_create(http, root), _create(http, root)]
        victim = _create(http, root)  # for DELETE and leases: the fuzzer may end it
        for env_id in stable:  # ways out of the environment a file API must not follow
            _sh(http, env_id, f"ln -s {canary.root} /work/app/out-abs && "
                              f"ln -s ../../../../../../../../..{canary.root} /work/app/out-rel && "
                              f"ln -s / /work/app/out-root")
        escapes = canary.paths() + ["/work/app/out-abs/written", "/work/app/out-rel/written",
                                    f"/work/app/out-root{canary.root}/written", "out-abs/written",
                                    "/work/app/out-abs", "/work/app/hello.txt", "hello.txt", "/etc/passwd"]
        assert http.post("/v1/volumes", json={"name": "fuzzed"}).status_code == 201
        (root / "volumes" / "fuzzed" / "data" / "out-abs").symlink_to(canary.root)
        (root / "volumes" / "fuzzed" / "data" / "out-rel").symlink_to(f"../../../../../../../../..{canary.root}")
        before_root = tree_snapshot(root, skip=NODE_OWN)
        before_canary = canary.state()

        schema = schemathesis.openapi.from_dict(http.get("/openapi.json").json())

        def variants(op, mode) -> list[dict]:
            if "{name}" in op.path:  # a volume's: the stable one, and ways out of it
                out = [op.as_strategy(generation_mode=mode, path_parameters={"name": "fuzzed"})]
                if op.path.endswith("/files") and mode.value == "positive":
                    out += [op.as_strategy(generation_mode=mode, path_parameters={"name": "fuzzed"}, query={"path": p})
                            for p in escapes + ["/out-abs/written", "/out-rel/written", "out-abs"]]
                return out if op.method.upper() != "DELETE" else []
            if "{env_id}" not in op.path:
                return []
            destructive = op.method.upper() == "DELETE" or op.path.endswith(("/lease", "/pause", "/resume"))
            ids = [victim] if destructive else stable
            out = [op.as_strategy(generation_mode=mode, path_parameters={"env_id": i}) for i in ids]
            if op.path.endswith("/files") and mode.value == "positive":
                out += [op.as_strategy(generation_mode=mode, path_parameters={"env_id": i}, query={"path": p})
                        for i in stable for p in escapes]
            return out

        def limit(op) -> int:  # each of these creates environments (or publishes a snapshot)
            return max(6, EXAMPLES // 10) if op.path.endswith(("/evaluate", "/fork", "/snapshot")) else EXAMPLES

        def full(case, response) -> bool:
            """`insufficient_capacity` (503, retryable) is the right answer of a full node (a
            fork of many), not a server error."""
            return response.status_code == 503 and b'"insufficient_capacity"' in response.content

        with ServerErrors() as errors:
            started = time.monotonic()
            failures, sent = fuzz_operations(schema, server.url, {"Authorization": f"Bearer {TOKEN}"},
                                             variants=variants, prepare=_bound_exec, limit=limit, accept=full)
            elapsed = time.monotonic() - started
        print(f"node API fuzz: {sent} requests in {elapsed:.0f} s ({EXAMPLES} examples per operation and mode)")
        assert not failures, "\n\n".join(failures)
        assert not errors.records, errors.records

        assert http.get("/healthz").status_code == 200
        for env_id in stable:
            # (the fuzzer may have rewritten any file in it, hello.txt among them)
            assert _sh(http, env_id, "echo alive; cat /eval/none 2>/dev/null; true")["stdout"] == "alive\n"
            assert http.get(f"/v1/environments/{env_id}").json()["state"] == "running"
        assert canary.state() == before_canary, "the API wrote outside the environment (canary dir)"
        after_root = tree_snapshot(root, skip=NODE_OWN)
        assert after_root == before_root, sorted(set(after_root) ^ set(before_root))
        strays = [str(p) for p in root.rglob("written")
                  if not p.is_relative_to(root / "envs") and not p.is_relative_to(root / "volumes")]
        assert not strays, f"a fuzzed path was written outside the environments: {strays}"

        for env in http.get("/v1/environments").json()["environments"]:
            remember(root, env["id"])
            http.delete(f"/v1/environments/{env['id']}")
        deadline = time.monotonic() + 120
        while http.get("/v1/environments").json()["environments"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not http.get("/v1/environments").json()["environments"]
