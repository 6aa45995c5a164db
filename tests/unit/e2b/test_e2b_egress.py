"""E2B's egress options as a rollstack plan `network` (pure: rollstack.e2b.models.egress_policy)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rollstack.e2b.models import ALL_TRAFFIC, NewSandbox, egress_policy


@pytest.mark.parametrize("internet, network, policy", [
    (None, None, None),  # neither: the template plan's
    (True, None, "outbound"),
    (False, None, "none"),
    (None, {"allowOut": ["1.1.1.1"]}, "outbound"),  # allowOut without denyOut allows everything (E2B)
    (None, {"denyOut": [ALL_TRAFFIC]}, "none"),
    (None, {"allowOut": ["1.1.1.1", "10.0.0.0/8:443"], "denyOut": [ALL_TRAFFIC]},
     {"allow": ["1.1.1.1", "10.0.0.0/8:443"]}),
    (False, {"allowOut": ["api.example.com"]}, {"allow": ["api.example.com"]}),
    (True, {"allowOut": [], "denyOut": [], "rules": {}}, "outbound"),  # empty fields are no request
    (None, {"allowPublicTraffic": True}, "outbound"),  # no public URLs on a node: holds either way
])
def test_egress_options_map_to_a_policy(internet, network, policy):
    assert egress_policy(internet, network) == policy


@pytest.mark.parametrize("network, field", [
    ({"denyOut": ["10.0.0.0/8"]}, "network.denyOut"),
    ({"denyOut": [ALL_TRAFFIC, "10.0.0.0/8"]}, "network.denyOut"),
    ({"egressProxy": {"address": "p:1"}}, "network.egressProxy"),
    ({"maskRequestHost": "x"}, "network.maskRequestHost"),
    ({"httpsPorts": [443]}, "network.httpsPorts"),
])
def test_what_cannot_be_honoured_is_refused_by_name(network, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        egress_policy(None, network)
    with pytest.raises(ValidationError, match=field):
        NewSandbox.model_validate({"templateID": "t:1", "network": network})


def test_the_create_request_carries_the_policy():
    req = NewSandbox.model_validate({"templateID": "t:1", "allow_internet_access": False})
    assert req.network_policy == "none"
    assert NewSandbox.model_validate({"templateID": "t:1"}).network_policy is None
