"""Isolation tiers through the node: a harness inside the environment talks to a scripted model
server in a netns of ours and fixes the task; exposed ports through the API; bad policies; the
gVisor tier (runtime: runsc)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from node_helpers import plan, remember, serve_node
from rollstack import Client, errors
from rollstack_bench.netlab import Upstream, serve_model

pytestmark = pytest.mark.integration
TOKEN = "net-integration-token"
MODEL_PORT = 30000

# The "harness": asks the model what to do (OpenAI chat completions over busybox wget), runs the
# command it answers with. Fails loudly when the endpoint cannot be reached.
HARNESS = r"""#!/bin/sh
set -u
: "${OPENAI_BASE_URL:?no model endpoint configured}"
req='{"model":"policy","messages":[{"role":"user","content":"fix hello.txt"}]}'
out=$(timeout 5 wget -q -O - --header "Authorization: Bearer $OPENAI_API_KEY" \
      --header "Content-Type: application/json" --post-data "$req" "$OPENAI_BASE_URL/chat/completions") \
  || { echo "harness: model endpoint $OPENAI_BASE_URL unreachable" >&2; exit 7; }
cmd=$(echo "$out" | sed -n 's/.*"content": *"\([^"]*\)".*/\1/p')
[ -n "$cmd" ] || { echo "harness: no command in $out" >&2; exit 8; }
echo "harness: running $cmd"
sh -c "$cmd"
"""


@pytest.fixture(scope="module")
def node(corpus: str, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("net-node-root")
    with serve_node(root, corpus, TOKEN, max_environments=6, reap_interval=0.5) as node:
        rt = node[0].stages.runtime
        yield node
    assert rt.network.owned(f"{rt.root}:") == []  # no network slot (netns, veth, table) left


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("model-upstream")
    (work / "www").mkdir()
    up = Upstream(work / "www")
    log = work / "requests.jsonl"
    try:
        serve_model(up, MODEL_PORT, "echo fixed > /work/app/hello.txt", log)
        yield up, log
    finally:
        up.close()


@pytest.fixture
def client(node):
    with Client(node[1].url, token=TOKEN) as c:
        yield c


def _create(client: Client, node, **overrides):
    env = client.create(plan(**overrides))
    remember(node[0].config.root, env.id)
    return env


def _run_harness(env) -> object:
    env.write_file("/tmp/harness.sh", HARNESS)
    return env.exec(["sh", "/tmp/harness.sh"], timeout=60)


def test_harness_reaches_model_fixes_task_and_scores_1(client, node, model):
    up, log = model
    with _create(client, node, network={"allow": [f"{up.addr}:{MODEL_PORT}"]},
                 env={"TASK": "app", "OPENAI_BASE_URL": "http://${ROLLSTACK_ENDPOINT_0}/v1",
                      "OPENAI_API_KEY": "${ROLLSTACK_ENV_TOKEN}"}) as env:
        net = env.created.network
        assert net is not None and net.mode == "allow"
        assert net.endpoints == [f"{up.addr}:{MODEL_PORT}"]
        r = _run_harness(env)
        assert r.exit_code == 0, r.stderr
        assert env.exec("cat hello.txt").stdout == "fixed\n"
        seen = [json.loads(line) for line in log.read_text().splitlines()]
        assert seen[-1]["auth"] == f"Bearer {net.token}"  # the per-environment token arrived
        assert seen[-1]["path"] == "/v1/chat/completions"
        score = env.evaluate()
        assert (score.reward, score.exit_code) == (1.0, 0), score.output
        # the clean evaluator had no network at all
        assert "PASS" in score.output


def test_same_run_without_network_fails_clearly(client, node, model):
    up, log = model
    def lines() -> int:  # the upstream writes its log at its first request
        return len(log.read_text().splitlines()) if log.exists() else 0

    before = lines()
    with _create(client, node, env={"TASK": "app",
                                    "OPENAI_BASE_URL": f"http://{up.addr}:{MODEL_PORT}/v1",
                                    "OPENAI_API_KEY": "none"}) as env:
        assert env.created.network is None
        r = _run_harness(env)
        assert r.exit_code == 7 and "unreachable" in r.stderr
        assert env.evaluate().reward == 0.0
    assert lines() == before  # nothing left the environment


def test_expose_through_the_authenticated_api(client, node):
    url = node[1].url
    with _create(client, node, expose=[8080, 8081]) as env:
        env.exec("httpd -p 8080 -h /work/app")
        base = f"{url}/v1/environments/{env.id}/ports"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        for _ in range(50):
            r = httpx.get(f"{base}/8080/hello.txt", headers=auth)
            if r.status_code != 502:
                break
        assert (r.status_code, r.text) == (200, "bug\n")
        assert httpx.get(f"{base}/8080/hello.txt").status_code == 401
        r = httpx.get(f"{base}/9090/x", headers=auth)
        assert r.status_code == 404 and "not exposed" in r.json()["error"]["message"]
        r = httpx.get(f"{base}/8081/x", headers=auth)
        assert r.status_code == 502 and r.json()["error"]["code"] == "port_unavailable"
        assert "8081" in r.json()["error"]["message"]
        # exposing gives no egress: the environment still cannot reach the node
        gw = env.created.network.gateway
        assert env.exec(f"timeout 3 wget -q -O - http://{gw}:{node[1].url.rsplit(':', 1)[1]}/healthz").exit_code != 0


# A one-shot HTTP server (busybox nc -e): the first part of its body, then it waits for /tmp/go
# (written by the test only after it has READ that part through the node), then the rest, and
# it echoes the request body it was sent.
STREAMER = r"""#!/bin/sh
while read -r line; do
  case "$line" in Content-Length:*|content-length:*) n=$(echo "$line" | tr -dc 0-9);; esac
  [ "$line" = "$(printf '\r')" ] && break
done
body=$(head -c "${n:-0}")
printf 'HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nfirst part\n'
i=0; while [ ! -e /tmp/go ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
printf 'second part, you sent: %s\n' "$body"
"""


def test_expose_streams_instead_of_buffering(client, node):
    with _create(client, node, expose=[8090]) as env:
        env.write_file("/tmp/streamer.sh", STREAMER)
        env.exec("chmod +x /tmp/streamer.sh && (nc -l -p 8090 -e /tmp/streamer.sh &)")
        url = f"{node[1].url}/v1/environments/{env.id}/ports/8090/stream"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(timeout=20) as http:
            with http.stream("POST", url, headers=auth, content=b"ping") as r:
                assert r.status_code == 200
                chunks = r.iter_raw()
                got = next(chunks)
                # a buffering proxy would hold "first part" until the server finished, which it
                # only does after /tmp/go exists: reaching this line proves streaming
                assert got.startswith(b"first part\n"), got
                assert env.exec("test -e /tmp/go").exit_code != 0
                env.write_file("/tmp/go", "")
                rest = got + b"".join(chunks)
        assert rest == b"first part\nsecond part, you sent: ping\n", rest


def test_environment_cannot_reach_the_node_api(client, node):
    api_port = node[1].url.rsplit(":", 1)[1]
    with _create(client, node, network="outbound") as env:
        gw = env.created.network.gateway
        for host in (gw, "127.0.0.1"):
            r = env.exec(f"timeout 3 wget -q -O - http://{host}:{api_port}/healthz")
            assert r.exit_code != 0, host


@pytest.mark.parametrize("network, field, words", [
    ({"allow": ["no-such-host.invalid:443"]}, "network.allow[0]", "cannot resolve"),
    ({"allow": ["10.0.0.1:0"]}, "network", "out of range"),
    ({"allow": ["host"]}, "network", "the node is reached on one port"),
    ({"allow": ["169.254.169.254:80"]}, "network", "never reachable"),
    ({"allow": ["host:7878"]}, "network.allow[0]", "node agent"),
    ("everything", "network", "not a network mode"),
])
def test_bad_policies_are_plan_invalid_and_leave_nothing(client, node, network, field, words):
    root = node[0].config.root
    node[0].wait_destroyed()  # earlier tests' destroys finish in the background
    before = sorted(p.name for p in (root / "envs").iterdir())
    with pytest.raises(errors.PlanInvalid) as exc:
        client.create(plan(network=network))
    assert exc.value.message.startswith(field) and words in exc.value.message, exc.value.message
    assert sorted(p.name for p in (root / "envs").iterdir()) == before


def test_gvisor_tier_through_the_node(client, node):
    with _create(client, node, runtime="runsc") as env:
        assert "4.4.0" in env.exec("uname -r").stdout  # gVisor's kernel
        r = env.exec("cat hello.txt; echo $TASK")
        assert (r.exit_code, r.stdout) == (0, "bug\napp\n")
        env.exec("echo fixed > hello.txt")
        assert "+fixed" in env.diff()
        score = env.evaluate()  # the evaluator runs under gVisor too
        assert (score.reward, score.exit_code) == (1.0, 0), score.output
        # the elastic provisioner samples the sandbox's cgroup
        for _ in range(50):
            hist = env.stats().history
            if hist and any((s.memory_usage or 0) > 0 for s in hist):
                break
            import time
            time.sleep(0.1)
        assert any((s.memory_usage or 0) > 0 for s in hist), hist


def test_gvisor_with_an_allow_policy_runs_the_harness(client, node, model):
    """runtime: runsc + network: gVisor's netstack on the prepared netns (rollstack.run.runsc)."""
    up, log = model
    with _create(client, node, runtime="runsc", network={"allow": [f"{up.addr}:{MODEL_PORT}"]},
                 env={"TASK": "app", "OPENAI_BASE_URL": "http://${ROLLSTACK_ENDPOINT_0}/v1",
                      "OPENAI_API_KEY": "${ROLLSTACK_ENV_TOKEN}"}) as env:
        assert "4.4.0" in env.exec("uname -r").stdout
        # not /tmp: gVisor gives the sandbox a /tmp of its own (files API writes there are not seen)
        env.write_file("/root/harness.sh", HARNESS)
        r = env.exec(["sh", "/root/harness.sh"], timeout=60)
        assert r.exit_code == 0, r.stderr
        seen = [json.loads(line) for line in log.read_text().splitlines()]
        assert seen[-1]["auth"] == f"Bearer {env.created.network.token}"
        gw = env.created.network.gateway  # still no way to the node's API
        assert env.exec(f"timeout 3 wget -q -O - http://{gw}:{node[1].url.rsplit(':', 1)[1]}/healthz").exit_code != 0
        score = env.evaluate()
        assert (score.reward, score.exit_code) == (1.0, 0), score.output


def test_a_forks_children_get_their_own_network_on_late_bound_sandboxes(client, node, model):
    """Children of a parent with an allow policy take late-bound sandboxes (no cold start) and
    each gets its own slot (address, token), the policy, and the allowed endpoint."""
    up, log = model
    service = node[0]
    overrides = dict(network={"allow": [f"{up.addr}:{MODEL_PORT}"]},
                     env={"TASK": "app", "OPENAI_BASE_URL": "http://${ROLLSTACK_ENDPOINT_0}/v1",
                          "OPENAI_API_KEY": "${ROLLSTACK_ENV_TOKEN}"})
    with _create(client, node, **overrides) as parent:
        parent.write_file("/tmp/harness.sh", HARNESS)
        for k in parent.fork(1):  # the node's first fork: the late pool starts filling
            k.destroy()
        assert service.stages.late.wait_full(120), service.stages.late.stats()
        kids = parent.fork(2)
        try:
            for k in kids:
                remember(service.config.root, k.id)
            assert [bool(k.created.timings.warm) for k in kids] == [True, True]
            nets = [parent.created.network] + [k.created.network for k in kids]
            assert len({n.address for n in nets}) == 3 and len({n.token for n in nets}) == 3
            for k, net in zip(kids, nets[1:]):
                assert net.mode == "allow" and net.endpoints == [f"{up.addr}:{MODEL_PORT}"]
                assert k.exec("ls /tmp/harness.sh").exit_code == 0  # the parent's file, at the cut
                r = k.exec(["sh", "/tmp/harness.sh"], timeout=60)
                assert r.exit_code == 0, r.stderr
                seen = json.loads(log.read_text().splitlines()[-1])
                assert seen["auth"] == f"Bearer {net.token}"  # this child's own token
                assert k.exec(["sh", "-c", "echo $ROLLSTACK_GATEWAY"]).stdout.strip() == net.gateway
        finally:
            for k in kids:
                k.destroy()
    service.wait_destroyed(120)
    rt = service.stages.runtime
    for env in (parent, *kids):  # every child's slot went with it (the node's prepared ones stay)
        assert rt.network.owned(f"{rt.root}:{env.id}") == []


def test_a_child_whose_network_fails_on_a_late_bound_sandbox_starts_cold(client, node, model, monkeypatch):
    from rollstack.node import warm

    up, _ = model
    service = node[0]
    network = service.stages.runtime.network
    real, calls = network.setup, []

    def setup(h, spec, attach_pid=None):  # noqa: ANN001 - NetworkManager.setup's signature
        if attach_pid is not None and threading.current_thread().name.startswith("rollstack-bind"):
            calls.append(h.slot)  # a late-bound sandbox's (a cold create's runs elsewhere)
            raise errors.RuntimeFailure("injected: the veth could not move")
        return real(h, spec, attach_pid=attach_pid)

    monkeypatch.setattr(warm, "BREAKER_STREAK", 2)
    monkeypatch.setattr(warm, "BREAKER_COOLDOWN", 0.5)  # what stays open after the test is short
    kids = []
    with _create(client, node, network={"allow": [f"{up.addr}:{MODEL_PORT}"]}) as parent:
        for k in parent.fork(1):
            k.destroy()
        m = service.metrics()
        failures, trips = m["fork_warm_bind_failures_total"], m["fork_warm_breaker_trips_total"]
        monkeypatch.setattr(network, "setup", setup)
        try:
            for n in (1, 2):  # a failed network counts once, as a failed bind: two in a row trip the breaker
                assert service.stages.late.wait_full(120)
                kids += parent.fork(1)
                remember(service.config.root, kids[-1].id)
                assert len(calls) == n and not kids[-1].created.timings.warm  # the sandbox failed: cold
                assert service.metrics()["fork_warm_bind_failures_total"] == failures + n
            assert service.metrics()["fork_warm_breaker_trips_total"] == trips + 1
            for kid in kids:
                assert kid.created.network is not None and kid.exec("true").exit_code == 0
        finally:
            for kid in kids:
                kid.destroy()
    service.wait_destroyed(120)
    rt = service.stages.runtime
    assert [rt.network.owned(f"{rt.root}:{e.id}") for e in (parent, *kids)] == [[], [], []]
    end = time.monotonic() + 60  # the breaker's (short) cooldown over: the next test's forks take sandboxes
    while service.metrics()["fork_warm_breaker_open"] and time.monotonic() < end:
        time.sleep(0.05)
    assert not service.metrics()["fork_warm_breaker_open"]
