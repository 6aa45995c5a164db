"""Published snapshots in a store: listed and deleted (docs/fork.md "Snapshots").

A snapshot `NAME:TAG` of an environment (published by the node: rollstack.node.stages.snapshot)
is two artifacts: the group `NAME-fs:TAG` (kind `snapshot`, its source annotation naming the
environment) holding the environment's changes as one layer, and the plan `NAME:TAG` stacking
that group on the environment's groups. The plan is published last, so a snapshot exists
exactly when both do; deleting removes the plan first, for the same reason. Layer blobs stay
until the store's garbage collection (as for any deleted manifest on a registry).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rollstack.errors import InvalidRequest, ManifestNotFound, TemplateNotFound
from rollstack.plan import lowers
from rollstack.plan.groups import ANN_CREATED, ANN_KIND, ANN_SOURCE, parse_group_manifest, split_name_tag
from rollstack.plan.published import list_plans

KIND = "snapshot"
_SOURCE = "snapshot of "
_GROUP_SUFFIX = "-fs"


@dataclass(slots=True)
class SnapshotInfo:
    plan: str
    """`NAME:TAG`: what `create` starts from."""
    group: str
    source: str
    """The id of the environment it was taken of ("" if unknown)."""
    created: str
    bytes: int
    layer: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def group_of(name_tag: str) -> str:
    """The group holding snapshot `NAME:TAG`'s changes (InvalidRequest for a malformed name)."""
    name, tag = split_name_tag(name_tag)
    group = f"{name}{_GROUP_SUFFIX}:{tag}"
    split_name_tag(group)
    return group


def source_desc(env_id: str) -> str:
    """The group's source annotation for a snapshot of `env_id`."""
    return f"{_SOURCE}{env_id}"


def list_snapshots(store: Any, source: str | None = None) -> list[SnapshotInfo]:
    """Every snapshot in `store` (of environment `source` only, if given), by plan name then tag.
    Only `*-fs` repositories are read (a store full of other groups costs one listing)."""
    out = []
    for repo in sorted(r for r in store.list_repositories() if r.endswith(_GROUP_SUFFIX)):
        name = repo[: -len(_GROUP_SUFFIX)]
        for tag in sorted(store.list_tags(repo)):
            group = _group(store, repo, tag)
            if group is None:
                continue
            ann, layers = group
            src = ann.get(ANN_SOURCE, "")
            src = src[len(_SOURCE):] if src.startswith(_SOURCE) else ""
            if (source is not None and src != source) or not store.has_manifest(name, tag):
                continue  # another's, or still being published / half deleted
            out.append(SnapshotInfo(plan=f"{name}:{tag}", group=f"{repo}:{tag}", source=src,
                                    created=ann.get(ANN_CREATED, ""), bytes=sum(int(x.get("size", 0)) for x in layers),
                                    layer=str(layers[0].get("digest", "")) if layers else ""))
    return out


def _group(store: Any, repo: str, tag: str) -> tuple[dict[str, str], list[dict[str, Any]]] | None:
    """(annotations, layer descriptors) of snapshot group `repo:tag`, None if it is none."""
    try:
        manifest = store.get_manifest(repo, tag)
    except ManifestNotFound:
        return None  # deleted meanwhile
    doc = parse_group_manifest(manifest.data)
    ann = (doc or {}).get("annotations") or {}
    if doc is None or ann.get(ANN_KIND) != KIND:
        return None
    return ann, lowers.layer_descriptors(doc)


def delete_snapshot(store: Any, name_tag: str) -> None:
    """Remove snapshot `NAME:TAG` (its plan, then its group); TemplateNotFound if `name_tag` is no
    snapshot (a plan or group of another kind is never touched), InvalidRequest while another
    published plan stacks its group (a snapshot of an environment created from it)."""
    name, tag = split_name_tag(name_tag)
    group_ref = group_of(name_tag)
    group_name = group_ref.rpartition(":")[0]
    if _group(store, group_name, tag) is None:
        raise TemplateNotFound(f"no snapshot {name}:{tag}")
    users = [f"{p.name}:{p.tag}" for p in list_plans(store)
             if group_ref in p.groups and (p.name, p.tag) != (name, tag)]
    if users:
        raise InvalidRequest(f"snapshot {name}:{tag} is stacked by {', '.join(sorted(users)[:5])}: delete those first")
    _delete_tag(store, name, tag)  # the plan first: no plan ever names a missing group
    _delete_tag(store, group_name, tag)


def _delete_tag(store: Any, repo: str, tag: str) -> None:
    """Remove `repo:tag`'s manifest unless another tag names the same one (a registry deletes a
    manifest with every tag pointing at it). Gone already is fine."""
    try:
        digest = store.get_manifest(repo, tag).digest
    except ManifestNotFound:
        return
    for other in store.list_tags(repo):
        if other == tag:
            continue
        try:
            if store.get_manifest(repo, other).digest == digest:
                return  # shared: the tag stays with it (hidden: no plan lists it any more)
        except ManifestNotFound:
            continue
    try:
        store.delete_manifest(repo, digest)
    except ManifestNotFound:
        pass
