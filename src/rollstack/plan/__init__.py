"""Packaging: plans, layer groups, resolution and task mutations.

    load_plan(source) -> Plan                                 model.py    (pydantic, plan_invalid)
    GroupRef.parse("repo/attrs:23.2.0")                       refs.py
    publish_group(store, "NAME:TAG", [src...]) / list_groups  groups.py
    import_image(image_ref, "NAME:TAG", store, cache_dir=...) imports.py  (skopeo for registries)
    Resolver(store, cache_dir, ttl).resolve(plan) -> ResolvedStack[LayerRef]   resolve.py
    apply_mutation(root, diff, workdir=...) -> MutationResult mutation.py (patch.py + apply.py pure)

Submodules are imported on first use of a name here, so `import rollstack.plan` costs nothing.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "Plan": "model", "load_plan": "model", "Resources": "model", "Evaluator": "model", "FetchPolicy": "model",
    "GroupRef": "refs",
    "publish_group": "groups", "list_groups": "groups", "PublishResult": "groups", "GroupInfo": "groups",
    "import_image": "imports",
    "Resolver": "resolve", "ResolvedStack": "resolve", "LayerRef": "resolve",
    "apply_mutation": "mutation", "MutationResult": "mutation",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'rollstack.plan' has no attribute {name!r}")
    return getattr(importlib.import_module(f"rollstack.plan.{module}"), name)
