"""The node's side of a plan's network: resolve the policy, fill the harness's variables.

Every environment with a network (`network` other than none, or `expose`) gets:

    ROLLSTACK_ENDPOINT_<i>   allow entry i as ADDRESS:PORT (`host:P` -> the gateway; a name -> its
                             first address; a CIDR -> CIDR:PORT, informational)
    ROLLSTACK_GATEWAY        the node, as seen from the environment
    ROLLSTACK_ENV_TOKEN      a random per-environment token (also in the create response's
                             `network.token`), so a model router can tell environments apart

and plan `env` values may reference them as `${ROLLSTACK_ENDPOINT_0}`, `${ROLLSTACK_GATEWAY}`,
`${ROLLSTACK_ENV_TOKEN}` (e.g. `OPENAI_BASE_URL: http://${ROLLSTACK_ENDPOINT_0}/v1`). The gateway
is known only once the runtime has claimed a slot, so `${ROLLSTACK_GATEWAY}` is substituted by
the runtime (rollstack.run.environment); the rest here. A reference to an endpoint the plan does
not have is `plan_invalid`, except in the node's own evaluator environments (no network by
design), where it expands to nothing.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from rollstack.errors import PlanInvalid
from rollstack.plan.network import network_mode
from rollstack.run.network import GATEWAY_REF, NetworkSpec, resolve_spec

_REF_RE = re.compile(r"\$\{(ROLLSTACK_ENDPOINT_([0-9]+)|ROLLSTACK_ENV_TOKEN)\}")


def network_spec(plan: Any, reserved_node_ports: tuple[int, ...] = ()) -> NetworkSpec:
    """The plan's resolved policy (names looked up now); PlanInvalid naming the field."""
    mode = network_mode(plan.network)
    entries = plan.network.entries() if mode == "allow" else []
    return resolve_spec(mode, entries, plan.expose, reserved_node_ports)


def harness_env(plan: Any, spec: NetworkSpec, token: str, internal: bool = False) -> dict[str, str]:
    """The environment's variables: the plan's `env` with references expanded, plus ours."""
    eps = list(spec.endpoints)
    ours: dict[str, str] = {}
    if spec.needs_netns:
        ours = {f"ROLLSTACK_ENDPOINT_{i}": ep for i, ep in enumerate(eps)}
        ours["ROLLSTACK_GATEWAY"] = GATEWAY_REF
        ours["ROLLSTACK_ENV_TOKEN"] = token

    def expand(key: str, value: str) -> str:
        def one(m: re.Match[str]) -> str:
            if m.group(1) == "ROLLSTACK_ENV_TOKEN":
                return token if spec.needs_netns else ""
            i = int(m.group(2))
            if i < len(eps):
                return eps[i]
            if internal:
                return ""
            raise PlanInvalid(f"env.{key}: references ROLLSTACK_ENDPOINT_{i} but network.allow "
                              f"has {len(eps)} entr{'y' if len(eps) == 1 else 'ies'}")
        return _REF_RE.sub(one, value)

    env = {k: expand(k, v) for k, v in plan.env.items()}
    return {**ours, **env}


def new_token() -> str:
    return secrets.token_urlsafe(24)
