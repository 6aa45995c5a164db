"""Published plans ("templates"): a plan stored in the artifact store under `NAME:TAG`, like a group.

A published plan is an OCI image manifest with `artifactType: application/vnd.rollstack.plan.v1`,
a small JSON config blob (`application/vnd.rollstack.plan.config.v1+json`: kind, name, created)
and one layer, the plan itself as canonical JSON (`application/vnd.rollstack.plan.v1+json`) with
its mutation diff inline (`mutation_text`) and its evaluator, so the plan is self-contained: a
node creates from `NAME:TAG` without seeing the publisher's files. This is what an E2B
`templateID` names (see rollstack.e2b).

Publishing the same plan under the same tag again keeps the existing manifest (nothing uploaded).
Group listing skips plan manifests and plan listing skips groups, so both share one store.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rollstack.errors import InvalidRequest, PlanInvalid, RollstackError, TemplateNotFound
from rollstack.plan.artifacts import canonical, created_now, find_manifest, parse_manifest, put_manifest
from rollstack.plan.refs import GroupRef

PLAN_ARTIFACT_TYPE = "application/vnd.rollstack.plan.v1"
PLAN_CONFIG_MEDIA_TYPE = "application/vnd.rollstack.plan.config.v1+json"
PLAN_MEDIA_TYPE = "application/vnd.rollstack.plan.v1+json"
ANN_CREATED = "org.opencontainers.image.created"
ANN_TITLE = "org.opencontainers.image.title"
MAX_PLAN_BYTES = 16 * 1024 * 1024
"""A published plan (with its mutation diff) larger than this is refused on load."""

_PLAN_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(slots=True)
class PlanInfo:
    name: str
    tag: str
    digest: str  # the manifest's digest
    plan_name: str  # the plan's own `name` field
    plan_digest: str  # the plan document's blob digest
    size: int
    groups: list[str]
    has_mutation: bool
    has_evaluator: bool
    created: str = ""
    unchanged: bool = False  # publish: the tag already named exactly this plan

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)




def is_plan_ref(text: Any) -> bool:
    """Whether `text` names a published plan: a string that is no existing file, spelled
    `NAME[:TAG]` (not ending in .yaml/.yml/.json, which is a missing plan file instead)."""
    if not isinstance(text, str) or not text.strip() or text.strip().endswith(_PLAN_SUFFIXES):
        return False
    if Path(text).exists():
        return False
    try:
        GroupRef.parse(text)
    except InvalidRequest:
        return False
    return True


def plan_document(plan: Any) -> dict[str, Any]:
    """The self-contained JSON form of a loaded plan: mutation inline, no file path."""
    doc: dict[str, Any] = plan.model_dump(mode="json", exclude_none=True)
    if plan.mutation_text is not None:
        doc.pop("mutation", None)
    return doc


def _split(name_tag: str) -> GroupRef:
    ref = GroupRef.parse(name_tag)
    if ref.pinned:
        raise InvalidRequest(f"{name_tag!r}: publish needs NAME:TAG, not a digest")
    return ref


def publish_plan(store: Any, name_tag: str, source: Any, *, created: str | None = None) -> PlanInfo:
    """Validate `source` (a plan file path, dict or Plan), resolve its mutation and store it as
    `NAME:TAG` in `store`."""
    from rollstack.plan.model import load_plan
    from rollstack.store.names import sha256_digest

    ref = _split(name_tag)
    assert ref.tag is not None
    plan = load_plan(source)
    doc = plan_document(plan)
    body = canonical(doc)
    if len(body) > MAX_PLAN_BYTES:
        raise PlanInvalid(f"the plan is {len(body)} bytes with its mutation; the limit is {MAX_PLAN_BYTES}")
    plan_digest = sha256_digest(body)

    existing = _manifest_doc(store, ref.name, ref.tag)
    if existing is not None:
        old_digest, old = existing
        layers = old.get("layers") or []
        if len(layers) == 1 and layers[0].get("digest") == plan_digest:
            return _info(ref.name, ref.tag, old_digest, old, doc, plan_digest, len(body), unchanged=True)

    created = created or created_now()
    config = canonical({"kind": "plan", "name": plan.name, "created": created})
    config_digest = sha256_digest(config)
    store.put_blob(ref.name, plan_digest, body)
    store.put_blob(ref.name, config_digest, config)
    digest, manifest = put_manifest(
        store, ref.name, ref.tag, PLAN_ARTIFACT_TYPE,
        {"mediaType": PLAN_CONFIG_MEDIA_TYPE, "digest": config_digest, "size": len(config)},
        [{"mediaType": PLAN_MEDIA_TYPE, "digest": plan_digest, "size": len(body)}],
        {ANN_CREATED: created, ANN_TITLE: plan.name})
    return _info(ref.name, ref.tag, digest, manifest, doc, plan_digest, len(body))


def load_published(store: Any, name_tag: str) -> Any:
    """The validated `Plan` published as `name_tag` (TemplateNotFound if there is none)."""
    from rollstack.plan.model import load_plan

    try:
        ref = GroupRef.parse(name_tag)
    except InvalidRequest as exc:
        raise TemplateNotFound(f"{name_tag!r} is not a template name: {exc.message}") from None
    found = _manifest_doc(store, ref.name, ref.ref)
    if found is None:
        raise TemplateNotFound(f"no published plan {str(ref)!r} in {getattr(store, 'url', 'the store')}")
    _, manifest = found
    layer = (manifest.get("layers") or [{}])[0]
    size, digest = int(layer.get("size", 0)), str(layer.get("digest", ""))
    if not 0 < size <= MAX_PLAN_BYTES:
        raise PlanInvalid(f"published plan {str(ref)!r} has an unusable size ({size} bytes)")
    from rollstack.store.names import sha256_digest

    body = store.read_blob(ref.name, digest, 0, size)
    if sha256_digest(body) != digest:
        from rollstack.errors import IntegrityError

        raise IntegrityError(f"published plan {str(ref)!r}: blob does not match its digest {digest}")
    try:
        doc = json.loads(body)
    except ValueError:
        raise PlanInvalid(f"published plan {str(ref)!r} is not JSON") from None
    return load_plan(doc)


def list_plans(store: Any) -> list[PlanInfo]:
    """Every tagged published plan in the store, sorted by name then tag (groups are skipped)."""
    out: list[PlanInfo] = []
    for repo in sorted(store.list_repositories()):
        for tag in sorted(store.list_tags(repo)):
            found = _manifest_doc(store, repo, tag)
            if found is None:
                continue
            digest, manifest = found
            layer = (manifest.get("layers") or [{}])[0]
            try:
                body = store.read_blob(repo, str(layer.get("digest")), 0, int(layer.get("size", 0)))
                doc = json.loads(body)
            except (RollstackError, ValueError, TypeError):
                doc = {}
            out.append(_info(repo, tag, digest, manifest, doc if isinstance(doc, dict) else {},
                             str(layer.get("digest", "")), int(layer.get("size", 0))))
    return out


def _info(name: str, tag: str, digest: str, manifest: dict[str, Any], doc: dict[str, Any],
          plan_digest: str, size: int, unchanged: bool = False) -> PlanInfo:
    ann = manifest.get("annotations") or {}
    return PlanInfo(
        name=name, tag=tag, digest=digest, plan_name=str(doc.get("name", ann.get(ANN_TITLE, ""))),
        plan_digest=plan_digest, size=size, groups=[str(g) for g in doc.get("groups") or []],
        has_mutation=bool(doc.get("mutation_text")), has_evaluator=doc.get("evaluator") is not None,
        created=str(ann.get(ANN_CREATED, "")), unchanged=unchanged,
    )


def parse_plan_manifest(data: bytes) -> dict[str, Any] | None:
    """The manifest document if it is a published plan, else None."""
    return parse_manifest(data, PLAN_ARTIFACT_TYPE, PLAN_CONFIG_MEDIA_TYPE)


def _manifest_doc(store: Any, repo: str, ref: str) -> tuple[str, dict[str, Any]] | None:
    return find_manifest(store, repo, ref, parse_plan_manifest)
