"""The Harbor provider with the real `harbor` package (its own Python 3.12 venv, `make setup`):
a Harbor job of three tasks, one on a prebuilt image (`docker_image`, imported), one built from
its Dockerfile by buildah, and one in Harbor's separate-verifier mode (the verifier in a second
environment built from `tests/Dockerfile`, the agent's output handed over as artifacts), each
solved by Harbor's `oracle` agent and scored by its verifier in rollstack environments on a real
node; `nop` (no solution) scores 0 on the prebuilt and the separate-verifier task."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from adapters_fixtures import BUSYBOX, build_trees
from components import need, require_tool
from node_helpers import serve_node
from oci_image_helpers import write_oci_image

pytestmark = pytest.mark.integration
TOKEN = "harbor-token"
REPO = Path(__file__).resolve().parents[3]
HARBOR = REPO / ".venv-harbor" / "bin" / "harbor"

VERIFY = """#!/bin/sh
if [ "$(cat {path} 2>/dev/null)" = "{want}" ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""


# Separate-verifier mode: the verifier's own image (tests/Dockerfile, the tests baked in, as Harbor
# wants: it uploads no tests/ into it) has a marker the agent's image lacks; the verifier must find
# its marker, not the agent's leftovers, and the agent's outputs where Harbor re-materializes them
# (a declared artifact at its own path, the convention dir /logs/artifacts at the same path).
SEPARATE_TESTS_DOCKERFILE = """FROM {base}
RUN echo verifier image > /verifier-marker
COPY test.sh /tests/test.sh
"""
SEPARATE_SOLVE = ('mkdir -p /work /logs/artifacts && touch /agent-was-here && '
                  'echo "$FROM_IMAGE 7 $([ -e /verifier-marker ] && echo marker || echo no-marker)" > /work/answer && '
                  'echo from the agent > /logs/artifacts/note')
SEPARATE_VERIFY = """#!/bin/sh
ok=1
[ "$(cat /verifier-marker 2>/dev/null)" = "verifier image" ] || ok=0
[ ! -e /agent-was-here ] || ok=0
[ "$(cat /work/answer 2>/dev/null)" = "yes 7 no-marker" ] || ok=0
[ "$(cat /logs/artifacts/note 2>/dev/null)" = "from the agent" ] || ok=0
echo "marker=$(cat /verifier-marker) agent-file=$([ -e /agent-was-here ] && echo yes || echo no)" \
     "answer=$(cat /work/answer) note=$(cat /logs/artifacts/note)"
echo $ok > /logs/verifier/reward.txt
"""


def _task(root: Path, *, solve: str, verify_path: str = "", want: str = "", docker_image: str | None = None,
          dockerfile: str | None = None, files: dict[str, str] | None = None, top: str = "", extra: str = "",
          verify: str | None = None, tests_files: dict[str, str] | None = None) -> Path:
    (root / "environment").mkdir(parents=True)
    (root / "solution").mkdir()
    (root / "tests").mkdir()
    env = "\n".join(["[environment]", "build_timeout_sec = 600.0", "cpus = 1", "memory_mb = 256",
                     *([f'docker_image = "{docker_image}"'] if docker_image else [])])
    (root / "task.toml").write_text(f'schema_version = "1.4"\n{top}[verifier]\ntimeout_sec = 120.0\n'
                                    f"[agent]\ntimeout_sec = 120.0\n{env}\n{extra}")
    (root / "instruction.md").write_text("Write the answer.\n")
    if dockerfile is not None:
        (root / "environment" / "Dockerfile").write_text(dockerfile)
    for name, text in (files or {}).items():
        (root / "environment" / name).write_text(text)
    for name, text in (tests_files or {}).items():
        (root / "tests" / name).write_text(text)
    for path, text in ((root / "solution" / "solve.sh", f"#!/bin/sh\nset -e\n{solve}\n"),
                       (root / "tests" / "test.sh", verify or VERIFY.format(path=verify_path, want=want))):
        path.write_text(text)
        path.chmod(0o755)
    return root


def _base_image(work: Path) -> str:
    """A busybox image as an OCI layout (what a registry pull would have given)."""
    tree = build_trees(work / "trees")["os"]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for child in sorted(tree.iterdir()):
            tar.add(child, arcname=child.name)
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "FROM_IMAGE=yes"], "WorkingDir": "/"},
              "rootfs": {"type": "layers", "diff_ids": []}, "history": [{"created_by": "busybox tree"}]}
    import hashlib

    config["rootfs"]["diff_ids"] = ["sha256:" + hashlib.sha256(buf.getvalue()).hexdigest()]
    write_oci_image(work / "base", [gzip.compress(buf.getvalue(), 1)], tag="t", config=config)
    return f"oci:{work / 'base'}:t"


@pytest.fixture
def harbor_node(tmp_path: Path):
    require_tool("runc", "fusermount3", "buildah", "skopeo")
    need(BUSYBOX.exists(), f"busybox-static ({BUSYBOX})")
    need(HARBOR.exists(), f"{HARBOR} (make setup builds it: Harbor needs Python 3.12)")
    spec = f"oci:{tmp_path / 'store'}"
    with serve_node(tmp_path / "node", spec, TOKEN, max_environments=6, reap_interval=0.5) as (service, server):
        yield service, server.url, spec


def _harbor(tmp_path: Path, url: str, spec: str, jobs: str, *args: str) -> dict:
    """Run `harbor run ARGS` with the rollstack provider; {task: reward} of the job's trials."""
    env = {**os.environ, "ROLLSTACK_NODE": url, "ROLLSTACK_TOKEN": TOKEN, "ROLLSTACK_STORE": spec,
           "ROLLSTACK_CLI": str(Path(sys.executable).parent / "rollstack"),
           "ROLLSTACK_HARBOR_CACHE": str(tmp_path / "cache"), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run([str(HARBOR), "run", *args, "-e", "rollstack.integrations.harbor:RollstackEnvironment",
                           "-o", str(tmp_path / jobs), "-y"], env=env, capture_output=True, text=True,
                          timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rewards = {}
    for result in (tmp_path / jobs).glob("*/*/result.json"):
        doc = json.loads(result.read_text())
        verifier = doc.get("verifier_result") or {}
        assert not doc.get("exception_info"), doc["exception_info"]
        rewards[result.parent.name.split("__")[0]] = (verifier.get("rewards") or {}).get("reward")
    return rewards


def _trial_dir(jobs: Path, task: str) -> Path:
    (trial,) = [result.parent for result in jobs.glob(f"*/{task}__*/result.json")]
    return trial


def test_a_harbor_job_runs_on_rollstack(harbor_node, tmp_path: Path) -> None:
    service, url, spec = harbor_node
    base = _base_image(tmp_path / "image")
    tasks = tmp_path / "tasks"
    _task(tasks / "prebuilt", docker_image=base, solve='mkdir -p /work && echo "$FROM_IMAGE 42" > /work/answer',
          verify_path="/work/answer", want="yes 42")
    _task(tasks / "dockerfile", dockerfile=f"FROM {base}\nRUN echo built > /built.txt\nWORKDIR /app\n"
                                           "COPY data.txt /app/data.txt\n",
          files={"data.txt": "data\n"}, solve="echo $(cat /built.txt data.txt) > /app/out",  # in the image's WORKDIR
          verify_path="/app/out", want="built data")
    # separate verifier: [verifier.environment] (no docker_image) + tests/Dockerfile = its own build
    _task(tasks / "separate", docker_image=base, solve=SEPARATE_SOLVE, top='artifacts = ["/work/answer"]\n',
          extra="[verifier.environment]\nbuild_timeout_sec = 600.0\ncpus = 1\nmemory_mb = 256\n",
          verify=SEPARATE_VERIFY, tests_files={"Dockerfile": SEPARATE_TESTS_DOCKERFILE.format(base=base)})
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({"job_name": "oracle", "n_concurrent_trials": 2,
                               "agents": [{"name": "oracle"}],
                               "tasks": [{"path": str(tasks / name)} for name in ("prebuilt", "dockerfile", "separate")]}))
    assert _harbor(tmp_path, url, spec, "jobs", "-c", str(job)) == {"prebuilt": 1.0, "dockerfile": 1.0, "separate": 1.0}
    # the verifier ran in its own image, not the agent's, and read what Harbor carried over
    trial = _trial_dir(tmp_path / "jobs", "separate")
    assert (trial / "verifier" / "test-stdout.txt").read_text().split() == [
        "marker=verifier", "image", "agent-file=no", "answer=yes", "7", "no-marker", "note=from", "the", "agent"]
    assert (trial / "artifacts" / "work" / "answer").read_text() == "yes 7 no-marker\n"  # collected on the host
    # images: the base ref (prebuilt and separate's agent), dockerfile, separate's tests/Dockerfile
    assert len(list((tmp_path / "cache" / "images").glob("*.json"))) == 3  # each built/imported once
    assert not service.list()  # every environment, the verifier's too, was destroyed by `stop`

    # no agent at all: the same verifiers in fresh environments score 0 (the cached images are reused)
    nop = tmp_path / "nop.yaml"
    nop.write_text(json.dumps({"job_name": "nop", "n_concurrent_trials": 2, "agents": [{"name": "nop"}],
                               "tasks": [{"path": str(tasks / name)} for name in ("prebuilt", "separate")]}))
    assert _harbor(tmp_path, url, spec, "nop-jobs", "-c", str(nop)) == {"prebuilt": 0.0, "separate": 0.0}
    trial = _trial_dir(tmp_path / "nop-jobs", "separate")
    assert "marker=verifier image agent-file=no answer= note=" in (trial / "verifier" / "test-stdout.txt").read_text()
    manifest = {e["source"]: e["status"] for e in json.loads((trial / "artifacts" / "manifest.json").read_text())}
    assert manifest["/work/answer"] == "failed"  # best-effort: the verifier just does not get it
    assert len(list((tmp_path / "cache" / "images").glob("*.json"))) == 3
    assert not service.list()
    assert str(tmp_path / "cache") not in Path("/proc/self/mountinfo").read_text()  # buildah left no mount
    assert not list((tmp_path / "cache").glob("rs-harbor-*"))  # nor its storage: it went with the build
