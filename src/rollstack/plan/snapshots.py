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

from rollstack.errors import ManifestNotFound, TemplateNotFound
from rollstack.plan.groups import ANN_KIND, list_groups, parse_group_manifest, split_name_tag

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
    """Every snapshot in `store` (of environment `source` only, if given), by plan name then tag."""
    out = []
    for g in list_groups(store):
        if g.kind != KIND or not g.name.endswith(_GROUP_SUFFIX):
            continue
        src = g.source[len(_SOURCE):] if g.source.startswith(_SOURCE) else ""
        if source is not None and src != source:
            continue
        name = g.name[: -len(_GROUP_SUFFIX)]
        if not store.has_manifest(name, g.tag):  # still being published, or half deleted
            continue
        out.append(SnapshotInfo(plan=f"{name}:{g.tag}", group=f"{g.name}:{g.tag}", source=src,
                                created=g.created, bytes=g.size,
                                layer=g.layer_digests[0] if g.layer_digests else ""))
    return sorted(out, key=lambda s: s.plan)


def delete_snapshot(store: Any, name_tag: str) -> None:
    """Remove snapshot `NAME:TAG` (its plan, then its group); TemplateNotFound if `name_tag` is no
    snapshot (a plan or group of another kind is never touched)."""
    name, tag = split_name_tag(name_tag)
    group_name, _, _ = group_of(name_tag).rpartition(":")
    try:
        group = store.get_manifest(group_name, tag)
    except ManifestNotFound:
        raise TemplateNotFound(f"no snapshot {name}:{tag}") from None
    doc = parse_group_manifest(group.data)
    if doc is None or (doc.get("annotations") or {}).get(ANN_KIND) != KIND:
        raise TemplateNotFound(f"{name}:{tag} is not a snapshot")
    try:
        plan = store.get_manifest(name, tag)
    except ManifestNotFound:
        pass  # a half-finished publish or delete: remove what is left
    else:
        store.delete_manifest(name, plan.digest)
    # another tag naming the same manifest (same changes, same second) keeps it
    shared = [t for t in store.list_tags(group_name) if t != tag and store.get_manifest(group_name, t).digest == group.digest]
    if not shared:
        store.delete_manifest(group_name, group.digest)
