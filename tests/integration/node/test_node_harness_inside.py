"""mini-swe-agent's real `mini` CLI inside the environment (the corpus's harness group) talks to
a scripted OpenAI-compatible model server in a network namespace of ours, fixes a corpus task,
and the clean evaluator scores 1.0; with `network: none` the same run fails clearly.

Real everything: the small corpus (built and cached like the demo test), the lazy store
(layers through its shifted view: user namespaces are on by default), runc, a netns + veth +
nftables allow policy, litellm's OpenAI client inside the environment. examples/mini_inside_env.py
is the code under test (`run`), so the example cannot rot.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from components import require_root
from corpus_helpers import published_corpus
from rollstack_bench.netlab import Upstream, serve_model

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "mini_inside_env.py"
PORT = 30000


def _log(msg: str) -> None:
    print(f"[harness-test] {msg}", flush=True)


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("mini_inside_env", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def corpus_node(tmp_path_factory: pytest.TempPathFactory):
    """The small corpus (built/published once, cached) and a local node over it."""
    from rollstack.client.local import Node
    from rollstack.tasks.plans import stack_groups

    require_root()
    corpus, spec = published_corpus(_log)
    groups = stack_groups(corpus.manifest["components"], harness="mini-swe-agent")
    with Node(store=spec, root=tmp_path_factory.mktemp("harness-node")) as node:
        yield node, corpus.tasks[0], groups
        assert node.service.wait_destroyed(120)  # background teardowns ('destroying' until done)
        assert node.list() == []


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory, corpus_node, example):
    work = tmp_path_factory.mktemp("harness-model")
    (work / "www").mkdir()
    up = Upstream(work / "www")
    log = work / "requests.jsonl"
    try:
        serve_model(up, PORT, json.dumps(example.scripted_replies(corpus_node[1])), log)
        yield up, log
    finally:
        up.close()


def _requests(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_mini_inside_the_environment_fixes_the_task_and_scores_1(corpus_node, model, example):
    node, task, groups = corpus_node
    up, log = model
    out = example.run(node, task, groups, f"{up.addr}:{PORT}")
    assert out["exit_code"] == 0, (out["stdout"][-2000:], out["stderr"][-2000:])
    assert out["reward"] == 1.0, out["evaluator_output"]
    assert out["uid_map"] == ["0", "100000", "65536"]  # the default: a user namespace
    seen = _requests(log)
    # the three scripted turns, each authenticated with this environment's token
    assert len(seen) == 3, seen
    assert {s["auth"] for s in seen} == {f"Bearer {out['network']['token']}"}
    assert all(s["path"] == "/v1/chat/completions" and s["model"] == "policy" for s in seen)
    # mini sent the tests' output back as the observation of the first action
    assert "passed" in json.dumps(seen[1]["messages"]) or "failed" in json.dumps(seen[1]["messages"])
    assert out["diff"].count("diff --git ") == 0  # the reference fix restores the original bytes


def test_the_same_run_with_network_none_fails_clearly(corpus_node, model, example):
    node, task, groups = corpus_node
    up, log = model
    before = len(_requests(log))
    out = example.run(node, task, groups, None, timeout=120)
    assert out["network"] is None
    assert out["exit_code"] != 0
    text = out["stdout"] + out["stderr"]
    assert "Connection error" in text, text[-3000:]  # litellm could not reach the model
    assert out["reward"] == 0.0
    assert len(_requests(log)) == before  # nothing left the environment
