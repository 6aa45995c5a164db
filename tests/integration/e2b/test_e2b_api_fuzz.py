"""The E2B-compatible API fuzzed (issue 35: bad input and failure), on the session's real node.

- The REST routes (control plane, envd's `/files` and `/health`) from their OpenAPI document
  (the control app's FastAPI schema; it is not served, E2B clients have their own): every
  operation gets schemathesis-generated requests, valid and invalid by the schema, with the
  node's key and a live sandbox's envd headers; `{sandbox_id}` is often a live sandbox, `path`
  often a canary directory on the host, and creates often name the real template.
- envd's Connect RPCs (not in any OpenAPI document): hypothesis-generated JSON messages for
  the unary filesystem and process RPCs, and envelopes (well- and ill-formed) for the streams.
No answer may be a 5xx or a Connect `internal`/`unknown` error, the server logs no error (the
package's autouse fixture), the canary stays untouched, and the live sandbox still works.
`ROLLSTACK_FUZZ_EXAMPLES` scales the run (tests/fuzz_helpers.py).
"""

from __future__ import annotations

import json
import struct
import time

import httpx
import pytest
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import strategies as st

from fuzz_helpers import EXAMPLES, Canary, fuzz_operations

pytestmark = pytest.mark.integration

from e2b import Sandbox  # noqa: E402

MAX_TIMEOUT = 120
"""Longest life the fuzzer may give a sandbox it creates (seconds)."""


@pytest.fixture
def boxes(e2b_node):
    """A live sandbox the fuzzer works on and a victim it may kill or time out; then every
    sandbox of the node is killed (the fuzzer creates some from the real template)."""
    keep = Sandbox.create(e2b_node.template, timeout=600)
    victim = Sandbox.create(e2b_node.template, timeout=600)
    try:
        yield keep, victim
    finally:
        with httpx.Client(base_url=e2b_node.url, headers={"X-API-KEY": e2b_node.token}, timeout=60) as http:
            for box in http.get("/sandboxes").json():
                http.delete(f"/sandboxes/{box['sandboxID']}")


def _envd_headers(box: Sandbox) -> dict[str, str]:
    return {"E2b-Sandbox-Id": box.sandbox_id, "X-Access-Token": box._envd_access_token}


def _plant_escapes(box: Sandbox, canary: Canary) -> list[str]:
    """Symlinks in the sandbox pointing at the canary: paths through them must not escape."""
    box.commands.run(f"ln -s {canary.root} /work/app/out-abs; ln -s ../../../../../../../..{canary.root} "
                     f"/work/app/out-rel; ln -s / /work/app/out-root")
    return canary.paths() + ["/work/app/out-abs/written", "/work/app/out-rel/written", "out-abs/written",
                             f"/work/app/out-root{canary.root}/written", "/work/app/hello.txt", "/etc/passwd"]


def _still_works(box: Sandbox, canary: Canary, before: dict) -> None:
    # (the fuzzer may have rewritten any file in it)
    assert box.commands.run("echo alive").stdout == "alive\n"
    box.files.write("/work/app/after-fuzz.txt", "ok\n")
    assert box.files.read("/work/app/after-fuzz.txt") == "ok\n"
    assert canary.state() == before, "the E2B API wrote outside the sandbox (canary dir)"


def test_fuzzing_the_e2b_rest_api_finds_no_server_error(e2b_node, boxes, tmp_path_factory) -> None:
    import schemathesis
    from rollstack.e2b.control import UNSUPPORTED, create_control_app
    from rollstack.e2b.sandboxes import SandboxTable

    keep, victim = boxes
    canary = Canary.make(tmp_path_factory.mktemp("e2b-canary"))
    escapes = _plant_escapes(keep, canary)
    before = canary.state()
    e2b_node.service.create_volume("fuzz-vol")  # a stable volume, with ways out of it planted
    vol_data = e2b_node.root / "volumes" / "fuzz-vol" / "data"
    (vol_data / "out-abs").symlink_to(canary.root)
    (vol_data / "out-rel").symlink_to(f"../../../../../../../../..{canary.root}")
    vol_escapes = escapes + ["/out-abs/written", "/out-rel/written", "out-abs", "/out-abs"]
    doc = create_control_app(SandboxTable(e2b_node.service), e2b_node.service, e2b_node.token).openapi()
    schema = schemathesis.openapi.from_dict(doc)

    def real_template(case):
        if isinstance(case.body, dict):
            case.body["templateID"] = e2b_node.template
            if not isinstance(case.body.get("timeout"), int) or case.body["timeout"] > MAX_TIMEOUT:
                case.body["timeout"] = MAX_TIMEOUT
        return case

    def variants(op, mode) -> list:
        out = []
        if "{sandbox_id}" in op.path:
            destructive = op.method.upper() == "DELETE" or op.path.endswith(("/timeout", "/connect", "/pause", "/resume"))
            box = victim if destructive else keep
            out.append(op.as_strategy(generation_mode=mode, path_parameters={"sandbox_id": box.sandbox_id}))
        if "{rest}" in op.path:
            out += [op.as_strategy(generation_mode=mode, path_parameters={"sandbox_id": keep.sandbox_id, "rest": r})
                    for r in sorted(UNSUPPORTED)]
        if "{volume_id}" in op.path and not (op.path == "/volumes/{volume_id}" and op.method.upper() == "DELETE"):
            out.append(op.as_strategy(generation_mode=mode, path_parameters={"volume_id": "fuzz-vol"}))
            if "/volumecontent/" in op.path and mode.value == "positive":
                out += [op.as_strategy(generation_mode=mode, path_parameters={"volume_id": "fuzz-vol"},
                                       query={"path": p}) for p in vol_escapes]
        if op.path == "/files" and mode.value == "positive":
            out += [op.as_strategy(generation_mode=mode, query={"path": p}) for p in escapes]
        if op.path in ("/sandboxes", "/v2/sandboxes") and op.method.upper() == "POST" and mode.value == "positive":
            out.append(op.as_strategy(generation_mode=mode).map(real_template))
        return out

    def limit(op) -> int:  # a create from the real template starts an environment
        return min(EXAMPLES, 10) if op.method.upper() == "POST" and op.path.endswith("sandboxes") else EXAMPLES

    def accept(case, response) -> bool:  # E2B features rollstack does not implement: 501 by design
        rest = str((case.path_parameters or {}).get("rest", "")).split("/")[0]
        return response.status_code == 501 and rest in UNSUPPORTED

    headers = {"X-API-KEY": e2b_node.token, **_envd_headers(keep)}
    started = time.monotonic()
    failures, sent = fuzz_operations(schema, e2b_node.url, headers, variants=variants, limit=limit,
                                     accept=accept)
    print(f"E2B REST fuzz: {sent} requests in {time.monotonic() - started:.0f} s")
    assert not failures, "\n\n".join(failures)
    _still_works(keep, canary, before)


# -- envd's Connect RPCs ---------------------------------------------------------------------

FS = "/filesystem.Filesystem/"
PROC = "/process.Process/"
UNARY = [FS + m for m in ("Stat", "ListDir", "MakeDir", "Move", "Remove", "CreateWatcher",
                          "GetWatcherEvents", "RemoveWatcher")] + \
        [PROC + m for m in ("List", "SendInput", "SendSignal", "CloseStdin", "Update")]
STREAMS = [PROC + "Start", PROC + "Connect", FS + "WatchDir", PROC + "StreamInput"]


def _frame(payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


def _json_values() -> st.SearchStrategy:
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                        max_leaves=12)


def _messages(paths: list[str]) -> st.SearchStrategy:
    """Messages shaped like envd's (most fields right, some wrong), and arbitrary JSON."""
    path = st.sampled_from(paths) | st.text(max_size=60)
    int_ish = st.integers(-2**70, 2**70) | st.sampled_from(["1", "-1", "x", "1e309"]) | _json_values()
    selector = st.fixed_dictionaries({}, optional={"pid": int_ish, "tag": st.text(max_size=20) | _json_values()})
    fields = {
        "path": path | _json_values(), "depth": int_ish, "source": path, "destination": path,
        "process": selector | st.fixed_dictionaries({}, optional={
            "cmd": st.sampled_from(["/bin/sh", "/bin/bash", "true", "", "/nonexistent"]) | st.text(max_size=20),
            "args": st.lists(st.text(max_size=20), max_size=3) | _json_values(),
            "envs": st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=3) | _json_values(),
            "cwd": path}),
        "signal": st.sampled_from(["SIGNAL_SIGKILL", "SIGNAL_SIGTERM", "SIGNAL_UNSPECIFIED", 9, 15, 0, -1, "x"]),
        "input": st.fixed_dictionaries({}, optional={"stdin": st.sampled_from(["aGk=", "!!", "", 5])}),
        "stdin": st.booleans() | _json_values(), "tag": st.text(max_size=20), "watcherId": st.text(max_size=20),
        "recursive": st.booleans() | _json_values(),
    }
    return st.fixed_dictionaries({}, optional=fields) | _json_values()


def _connect_error(response: httpx.Response) -> str | None:
    """The Connect error code of a unary or streamed answer (None: no error)."""
    ctype = response.headers.get("content-type", "")
    body = response.content
    if ctype.startswith("application/connect+"):
        i, last = 0, None
        while i + 5 <= len(body):
            flags, n = struct.unpack(">BI", body[i:i + 5])
            if flags & 2:
                last = json.loads(body[i + 5:i + 5 + n] or b"{}")
            i += 5 + n
        return (last or {}).get("error", {}).get("code") if last else None
    if response.status_code >= 400 and ctype.startswith("application/json"):
        return json.loads(body).get("code")
    return None


def test_fuzzing_envd_connect_rpcs_finds_no_internal_error(e2b_node, boxes, tmp_path_factory) -> None:
    keep, _victim = boxes
    canary = Canary.make(tmp_path_factory.mktemp("envd-canary"))
    paths = _plant_escapes(keep, canary)
    before = canary.state()
    seen: list[tuple[str, int, str | None]] = []
    headers = {**_envd_headers(keep), "connect-protocol-version": "1", "connect-timeout-ms": "3000"}

    with httpx.Client(base_url=e2b_node.url, headers=headers, timeout=60) as http:
        @settings(max_examples=EXAMPLES * 4, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet)
        @given(rpc=st.sampled_from(UNARY + STREAMS), message=_messages(paths),
               framing=st.sampled_from(["ok", "ok", "ok", "raw", "truncated", "compressed", "junk"]),
               junk=st.binary(max_size=64))
        def call(rpc: str, message, framing: str, junk: bytes) -> None:
            payload = json.dumps(message).encode()
            if rpc in UNARY:
                body = {"ok": payload, "raw": payload, "truncated": payload[: len(payload) // 2],
                        "compressed": payload, "junk": junk}[framing]
                r = http.post(rpc, content=body, headers={"Content-Type": "application/json"})
            else:
                body = {"ok": _frame(payload), "raw": payload, "truncated": _frame(payload)[:-1] if payload else b"\0",
                        "compressed": _frame(payload, flags=1), "junk": junk}[framing]
                r = http.post(rpc, content=body, headers={"Content-Type": "application/connect+json"})
            code = _connect_error(r)
            if framing == "compressed" and code == "internal" and b"compressed message" in r.content:
                # connectrpc answers a compressed flag without a negotiated encoding as connect-go
                # (the reference) does: `internal`, "protocol error" (in a 200 stream, never a 500)
                return
            seen.append((rpc, r.status_code, code))
            assert r.status_code < 500 or code == "unimplemented", (rpc, body, r.status_code, r.text[:500])
            assert code not in ("internal", "unknown"), (rpc, body, r.text[:500])

        call()
    assert any(code is None for _, _, code in seen), "no RPC ever succeeded: the fuzzer tested nothing"
    _still_works(keep, canary, before)
