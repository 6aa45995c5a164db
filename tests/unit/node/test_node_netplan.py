"""The harness's variables: endpoint and token references in plan env."""

from __future__ import annotations

import pytest

from rollstack.errors import PlanInvalid
from rollstack.node.netplan import harness_env, network_spec
from rollstack.plan.model import load_plan
from rollstack.run.network import GATEWAY_REF


def _plan(**kw):
    return load_plan({"groups": ["a/b:1"], **kw})


def test_references_expand_and_ours_are_set():
    p = _plan(network={"allow": ["10.1.2.3:30000", "host:8000"]},
              env={"OPENAI_BASE_URL": "http://${ROLLSTACK_ENDPOINT_0}/v1",
                   "ANTHROPIC_BASE_URL": "http://${ROLLSTACK_ENDPOINT_1}",
                   "OPENAI_API_KEY": "${ROLLSTACK_ENV_TOKEN}", "PLAIN": "$HOME ${OTHER}"})
    env = harness_env(p, network_spec(p), "tok")
    assert env["OPENAI_BASE_URL"] == "http://10.1.2.3:30000/v1"
    assert env["ANTHROPIC_BASE_URL"] == f"http://{GATEWAY_REF}:8000"  # the runtime fills the gateway
    assert env["OPENAI_API_KEY"] == "tok" and env["ROLLSTACK_ENV_TOKEN"] == "tok"
    assert env["ROLLSTACK_ENDPOINT_0"] == "10.1.2.3:30000" and env["ROLLSTACK_GATEWAY"] == GATEWAY_REF
    assert env["PLAIN"] == "$HOME ${OTHER}"  # only our references are touched


def test_missing_endpoint_is_plan_invalid_except_in_evaluators():
    p = _plan(env={"URL": "http://${ROLLSTACK_ENDPOINT_0}/v1"})
    with pytest.raises(PlanInvalid, match=r"^env.URL: references ROLLSTACK_ENDPOINT_0 but network.allow has 0"):
        harness_env(p, network_spec(p), "")
    env = harness_env(p, network_spec(p), "", internal=True)
    assert env == {"URL": "http:///v1"}  # no network: nothing of ours is set


def test_no_network_sets_nothing_of_ours():
    p = _plan(env={"A": "1"})
    assert harness_env(p, network_spec(p), "") == {"A": "1"}
