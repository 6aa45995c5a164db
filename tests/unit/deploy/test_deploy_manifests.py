"""deploy/kubernetes, validated offline (no API server can run here).

- Kubernetes kinds (Namespace, ConfigMap, Job, Deployment, Service): `kubernetes-validate`'s
  bundled schemas, strict (unknown fields rejected), for the oldest and newest version it ships
  that we claim (1.30, 1.37).
- RayCluster: our own structural schema of the KubeRay v1 RayCluster fields deploy/ uses (RAY_SCHEMA,
  written from KubeRay's documented API, not copied from its CRD), plus a strict walk for unknown
  fields (the API server would prune them silently), plus each pod template as a strict Pod.
- What rollstack needs of them: privileged environment nodes with /dev/fuse, the node root on a
  hostPath, the `rollstack` Ray resource, the gateway command the CLI accepts, a Service that
  selects it, addresses that point at what the RayCluster exposes.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
VERSIONS = ("1.30.0", "1.37.0")
_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_POD_TEMPLATE = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}  # validated as a strict Pod
RAY_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayCluster"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["headGroupSpec"],
            "properties": {
                "rayVersion": {"type": "string"},
                "enableInTreeAutoscaling": {"type": "boolean"},
                "headGroupSpec": {
                    "type": "object",
                    "required": ["template"],
                    "properties": {"serviceType": {"type": "string"}, "rayStartParams": _STR_MAP,
                                   "template": _POD_TEMPLATE},
                },
                "workerGroupSpecs": {"type": "array", "items": {
                    "type": "object",
                    "required": ["groupName", "template"],
                    "properties": {"groupName": {"type": "string"}, "replicas": {"type": "integer", "minimum": 0},
                                   "minReplicas": {"type": "integer", "minimum": 0},
                                   "maxReplicas": {"type": "integer", "minimum": 0},
                                   "rayStartParams": _STR_MAP, "template": _POD_TEMPLATE},
                }},
            },
        },
    },
}
"""The RayCluster v1 fields deploy/ uses, with their types (strings for rayStartParams values, as
KubeRay requires)."""


def _docs() -> list[dict]:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    out = []
    for name in kust["resources"]:
        out += [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    return out


DOCS = _docs()


def _one(kind: str, name: str | None = None) -> dict:
    found = [d for d in DOCS if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def unknown_fields(obj, schema, path="$") -> list[str]:
    """Fields the structural schema does not declare (what `kubectl --validate=strict` rejects)."""
    bad = []
    if isinstance(obj, dict) and schema.get("type") == "object":
        props = schema.get("properties")
        if props is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
            for k, v in obj.items():
                if k in props:
                    bad += unknown_fields(v, props[k], f"{path}.{k}")
                elif "additionalProperties" not in schema and not (path == "$" and k in ("apiVersion", "kind", "metadata")):
                    bad.append(f"{path}.{k}")
        elif isinstance(schema.get("additionalProperties"), dict):
            for k, v in obj.items():
                bad += unknown_fields(v, schema["additionalProperties"], f"{path}.{k}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(obj):
            bad += unknown_fields(v, schema["items"], f"{path}[{i}]")
    return bad


def validate_raycluster(doc: dict) -> None:
    jsonschema.Draft7Validator(RAY_SCHEMA).validate(doc)
    bad = unknown_fields(doc, RAY_SCHEMA)
    if bad:
        raise jsonschema.ValidationError(f"unknown fields: {bad}")
    spec = doc["spec"]
    for tmpl in [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "t", **tmpl.get("metadata", {})}, "spec": tmpl["spec"]}
        for v in VERSIONS:
            kubernetes_validate.validate(pod, v, strict=True)


def test_kustomization_lists_every_manifest():
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == on_disk
    assert kust["namespace"] == _one("Namespace")["metadata"]["name"] == "rollstack"


@pytest.mark.parametrize("version", VERSIONS)
def test_kubernetes_kinds_pass_strict_schema_validation(version):
    kinds = set()
    for doc in DOCS:
        if doc["apiVersion"].startswith("ray.io/"):
            continue
        kubernetes_validate.validate(doc, version, strict=True)
        kinds.add(doc["kind"])
    assert kinds == {"Namespace", "ConfigMap", "Job", "Deployment", "Service"}


def test_raycluster_passes_the_kuberay_crd_schema_and_its_pods_the_pod_schema():
    validate_raycluster(_one("RayCluster"))


@pytest.mark.parametrize("mutate", [
    lambda d: d["spec"]["workerGroupSpecs"][0].__setitem__("replicas", "four"),
    lambda d: d["spec"]["workerGroupSpecs"][0].__setitem__("replica", 4),
    lambda d: d["spec"].__setitem__("headGroup", {}),
    lambda d: d["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["securityContext"].__setitem__("privilegd", True),
    lambda d: d["spec"]["workerGroupSpecs"][0]["template"]["spec"]["volumes"][0]["hostPath"].__setitem__("type", 7),
])
def test_the_raycluster_validation_catches_mistakes(mutate):
    doc = copy.deepcopy(_one("RayCluster"))
    mutate(doc)
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
        validate_raycluster(doc)


def test_the_kubernetes_validation_catches_mistakes():
    doc = copy.deepcopy(_one("Deployment", "rollstack-gateway"))
    doc["spec"]["template"]["spec"]["containers"][0]["port"] = [7878]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, VERSIONS[-1], strict=True)


def _worker() -> dict:
    [group] = _one("RayCluster")["spec"]["workerGroupSpecs"]
    return group


def test_environment_nodes_are_privileged_with_fuse_node_root_and_the_rollstack_resource():
    from rollstack.cluster.ray_env import RESOURCE
    from rollstack.cluster.control import DEFAULT_ROOT

    group = _worker()
    # KubeRay trims the quotes and parses the JSON into `ray start --resources`
    assert json.loads(group["rayStartParams"]["resources"].strip("'\"` ").replace('\\"', '"')) == {RESOURCE: 1}
    assert "resources" not in _one("RayCluster")["spec"]["headGroupSpec"]["rayStartParams"]
    pod = group["template"]["spec"]
    [c] = pod["containers"]
    assert c["securityContext"]["privileged"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    fuse = next(n for n, v in volumes.items() if v.get("hostPath", {}).get("path") == "/dev/fuse")
    assert volumes[fuse]["hostPath"]["type"] == "CharDevice" and mounts[fuse] == "/dev/fuse"
    root = next(n for n, m in mounts.items() if str(DEFAULT_ROOT).startswith(m.rstrip("/") + "/"))
    assert "hostPath" in volumes[root]
    assert c["command"] == ["/usr/local/bin/rollstack-entrypoint"]
    assert {"name": "ROLLSTACK_CGROUP_DELEGATE", "value": "1"} in c["env"]
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["labelSelector"]["matchLabels"].items() <= group["template"]["metadata"]["labels"].items()


def test_addresses_and_versions_match_what_the_cluster_exposes():
    ray = _one("RayCluster")
    cfg = _one("ConfigMap", "rollstack")["data"]
    m = re.fullmatch(r"ray://([a-z0-9-]+)-head-svc\.([a-z0-9-]+)\.svc:(\d+)", cfg["RAY_ADDRESS"])
    assert m and m.group(1) == ray["metadata"]["name"] and m.group(2) == "rollstack"
    head_ports = {p["containerPort"] for p in ray["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]}
    assert int(m.group(3)) in head_ports
    assert re.match(r"https?://", cfg["ROLLSTACK_STORE"])
    pin = re.search(r'"ray==([0-9.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert ray["spec"]["rayVersion"] == pin


def test_gateway_deployment_service_and_job_run_commands_the_cli_accepts():
    dep = _one("Deployment", "rollstack-gateway")
    [c] = dep["spec"]["template"]["spec"]["containers"]
    argv = c["command"]
    assert argv[:3] == ["rollstack", "cluster", "gateway"]
    assert argv[argv.index("--listen") + 1] == "0.0.0.0:7878" and argv[argv.index("--address") + 1] == "$(RAY_ADDRESS)"
    assert {"configMapRef": {"name": "rollstack"}} in c["envFrom"]
    svc = _one("Service", "rollstack-gateway")
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    [port] = svc["spec"]["ports"]
    assert port["port"] == 7878 and port["targetPort"] in {p["name"] for p in c["ports"]}
    assert {p["containerPort"] for p in c["ports"]} == {7878}
    job = _one("Job", "rollstack-cluster-up")
    [jc] = job["spec"]["template"]["spec"]["containers"]
    assert jc["command"][:3] == ["rollstack", "cluster", "up"]
    env = {**os.environ, "COLUMNS": "200"}
    for sub, flags in (("gateway", ["--listen", "--address"]), ("up", ["--store", "--address", "--json"])):
        p = subprocess.run([sys.executable, "-m", "rollstack.cli.main", "cluster", sub, "--help"],
                           capture_output=True, text=True, env=env, timeout=120)
        assert p.returncode == 0, p.stderr
        for flag in flags:
            assert flag in p.stdout, (sub, flag)
    # the Job's --address/--store come from the environment the ConfigMap sets
    assert {"RAY_ADDRESS", "ROLLSTACK_STORE"} <= _one("ConfigMap", "rollstack")["data"].keys()
    assert {"configMapRef": {"name": "rollstack"}} in jc["envFrom"]


def test_image_recipe_refers_to_files_that_exist_and_the_entrypoint_runs(tmp_path):
    dockerfile = (DEPLOY / "image" / "Dockerfile").read_text()
    for rel in ("scripts/setup-system.sh", "third_party/pyfuse3/build.sh", "deploy/image/entrypoint.sh"):
        assert rel in dockerfile and (ROOT / rel).exists(), rel
    images = {c["image"] for d in DOCS for c in _containers(d)}
    assert len(images) == 1  # one image for head, nodes, gateway and job
    entry = DEPLOY / "image" / "entrypoint.sh"
    assert subprocess.run(["sh", "-n", str(entry)]).returncode == 0
    # without ROLLSTACK_CGROUP_DELEGATE it touches no cgroup and execs its arguments
    out = tmp_path / "ran"
    p = subprocess.run(["sh", str(entry), "sh", "-c", f"echo ok > {out}"], env={"PATH": os.environ["PATH"]})
    assert p.returncode == 0 and out.read_text() == "ok\n"
    assert subprocess.run(["sh", str(entry)], env={"PATH": os.environ["PATH"]}).returncode == 0


@pytest.mark.parametrize("controllers, expect", [("cpuset cpu io memory hugetlb pids", "+cpu +memory +pids"),
                                                 ("cpu memory", "+cpu +memory")])
def test_entrypoint_delegates_a_cgroup_v2_root(tmp_path, controllers, expect):
    """On a stand-in for the container's cgroup v2 root (regular files: this machine is cgroup v1
    and the real root is not ours): the processes go to `init`, the controllers to children."""
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.procs").write_text("1\n17\n")
    env = {"PATH": os.environ["PATH"], "ROLLSTACK_CGROUP_DELEGATE": "1", "ROLLSTACK_CGROUP_ROOT": str(root)}
    p = subprocess.run(["sh", str(DEPLOY / "image" / "entrypoint.sh")], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert (root / "init" / "cgroup.procs").read_text() == "1\n17\n"
    assert (root / "cgroup.subtree_control").read_text() == expect + "\n"
    # cgroup v1 (no cgroup.controllers): nothing is touched
    (root / "cgroup.controllers").unlink()
    (root / "cgroup.subtree_control").unlink()
    assert subprocess.run(["sh", str(DEPLOY / "image" / "entrypoint.sh")], env=env).returncode == 0
    assert not (root / "cgroup.subtree_control").exists()


def _containers(doc: dict) -> list[dict]:
    spec = doc.get("spec", {})
    if doc["kind"] == "RayCluster":
        return [c for t in [spec["headGroupSpec"]] + spec["workerGroupSpecs"] for c in t["template"]["spec"]["containers"]]
    if doc["kind"] in ("Deployment", "Job"):
        return spec["template"]["spec"]["containers"]
    return []
