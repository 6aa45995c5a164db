"""`rollstack bench init --image REF --command CMD`: any OCI image, rollstack vs docker-equivalent.

The image (an OCI layout `oci:DIR[:TAG]` or a registry reference) is imported as a layer group
(`plan.imports.import_image`, timed: the import's MB/s of unpacked data, and a re-import of the
unchanged image) into the bench registry behind the shaped link, and pushed there unchanged
for containerd. Then, side by side in rounds (`--cold` rounds; each round runs both systems):

- rollstack **first-ever cold**: fresh node (chunk cache, TOCs, traces gone, page cache dropped)
  and no access trace of the image anywhere (the registry's shared traces removed) — only the
  first round;
- rollstack **shared-trace cold**: fresh node, the trace an earlier node published is found in
  the registry (a second node of a cluster, or a group imported with `--probe`);
- rollstack **warm, FUSE lowers**: a second environment on the same node right after;
- rollstack **warm, materialized**: after the node has materialized the layer (`lowers.extract`);
- containerd **cold**: image removed, page cache dropped, `ctr pull` + create + start the command;
- containerd **warm**: create + start with the image present.

Every figure is request -> first command done, like `bench init`.
"""

from __future__ import annotations

import shlex
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rollstack.errors import InvalidRequest


@dataclass
class ImageInitConfig:
    image: str
    command: str
    cold: int = 3
    warm: int = 3
    profile: str = "dc"
    work: Path = Path("/var/cache/rollstack/bench-init-image")
    fresh_import: bool = True
    probe: bool = False  # `import --probe COMMAND`: round 0 starts from the probe's published trace
    log: Callable[[str], None] = print
    extra: dict[str, Any] = field(default_factory=dict)
    node_options: dict[str, Any] = field(default_factory=dict)  # NodeConfig fields of the rollstack node


def image_name(ref: str) -> str:
    """A registry repository name for the image (`bench-image/<last path part>`)."""
    base = ref.rstrip("/").removeprefix("oci:")
    if base.count(":") and not base.rsplit(":", 1)[1].count("/"):
        base = base.rsplit(":", 1)[0]
    last = base.rstrip("/").rsplit("/", 1)[-1].lower()
    clean = "".join(c if c.isalnum() or c in "-_." else "-" for c in last).strip("-.") or "image"
    return f"bench-image/{clean}"


def summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Pure: per kind, p50/min/max of first_cmd_s, and the speedups vs containerd cold/warm."""
    by: dict[str, list[float]] = {}
    for s in samples:
        by.setdefault(s["kind"], []).append(s["first_cmd_s"])
    out: dict[str, Any] = {k: {"p50": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
                           for k, v in sorted(by.items())}
    ctd_cold = out.get("containerd_cold", {}).get("p50")
    if ctd_cold:
        for k in ("rollstack_first_ever", "rollstack_probed_first", "rollstack_shared_trace"):
            if k in out:
                out[k]["speedup_vs_containerd_cold"] = ctd_cold / out[k]["p50"]
    ctd_warm = out.get("containerd_warm", {}).get("p50")
    if ctd_warm:  # the environments right after a cold one (whatever lowers the node has by then)
        for k in ("rollstack_warm_next", "rollstack_warm_materialized"):
            if k in out:
                out[k]["vs_containerd_warm"] = out[k]["p50"] / ctd_warm
    return out


def targets(s: dict[str, Any]) -> dict[str, Any]:
    def t(kind: str, key: str, target: float, le: bool) -> dict[str, Any] | None:
        v = s.get(kind, {}).get(key)
        if v is None:
            return None
        return {"value": v, "target": target, "met": v <= target if le else v >= target}

    out = {"shared_trace_cold_s": t("rollstack_shared_trace", "p50", 1.0, True),
           "first_ever_cold_s": t("rollstack_first_ever", "p50", 1.5, True),
           "shared_trace_speedup": t("rollstack_shared_trace", "speedup_vs_containerd_cold", 20.0, False),
           "warm_next_vs_containerd_warm": t("rollstack_warm_next", "vs_containerd_warm", 1.0, True)}
    return {k: v for k, v in out.items() if v is not None}


@dataclass(frozen=True)
class BenchImage:
    """An image as both systems of a bench run get it: the imported layer group (rollstack) and
    the image pushed unchanged to the bench registry (containerd)."""

    image: str
    group: str
    """NAME:TAG of the imported layer group"""
    ctr_ref: str
    """what containerd pulls"""
    import_doc: dict[str, Any]


def import_bench_image(rig: Any, image: str, work: Path, *, fresh_import: bool = True, reimport: bool = True,
                       log: Callable[[str], None] = print) -> BenchImage:
    """Import `image` as a layer group into the rig's registry (timed; `reimport`: once more,
    unchanged) and push it there as it is for containerd."""
    import shutil

    from rollstack_bench.systems.oci import push
    from rollstack.plan.imports import _open_source, import_image
    from rollstack.store import open_store

    repo = image_name(image)  # the image as it is, for containerd
    group = repo.replace("bench-image/", "bench-group/", 1) + ":latest"  # the imported layer group
    store = open_store(rig.registry.url)
    cache = work / "import-cache" / repo.rsplit("/", 1)[-1]
    if fresh_import:
        shutil.rmtree(cache, ignore_errors=True)
    try:
        t = time.perf_counter()
        res = import_image(image, group, store, cache_dir=cache, work_dir=work)
        import_s = time.perf_counter() - t
        again = None
        if reimport:
            t = time.perf_counter()
            again = import_image(image, group, store, cache_dir=cache, work_dir=work)
            reimport_s = time.perf_counter() - t
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()
    doc = {"seconds": import_s, "unpacked_bytes": res.payload_bytes,
           "source_bytes": sum(la.size for la in _open_source(image, False).layers),
           "mb_per_s": res.payload_bytes / import_s / 1e6 if import_s else None,
           "converted": res.converted, "uploaded_bytes": res.uploaded_bytes,
           "transfer": res.transfer, "layers": len(res.layers)}
    msg = f"import {image}: {res.payload_bytes / 1e6:.0f} MB unpacked in {import_s:.1f}s ({doc['mb_per_s']:.0f} MB/s)"
    if again is not None:
        doc.update(reimport_seconds=reimport_s, reimport_converted=again.converted)
        msg += f"; re-import {reimport_s:.2f}s"
    log(msg)
    layout, tag = _layout_of(image, work / "sources" / repo.rsplit("/", 1)[-1])  # one copy per image
    t = time.perf_counter()
    push(layout, tag, rig.registry.address, repo)
    log(f"pushed for containerd in {time.perf_counter() - t:.1f}s")
    return BenchImage(image, group, f"{rig.registry.address}/{repo}:{tag}", doc)


def run_init_image(cfg: ImageInitConfig) -> dict[str, Any]:
    from rollstack_bench.systems.rig import BenchRig
    from rollstack_bench.systems.containerd import drop_page_cache
    from rollstack_bench.systems.rollstack import RollstackSystem, forget_shared_traces, work_lock

    if not cfg.command.strip():
        raise InvalidRequest("--command: give the command to run in the image")
    log = cfg.log
    cmd = ["/bin/sh", "-c", cfg.command]
    samples: list[dict[str, Any]] = []
    doc: dict[str, Any] = {"image": cfg.image, "command": cfg.command}
    with work_lock(cfg.work), BenchRig(cfg.work, cfg.profile) as rig:
        bench_image = import_bench_image(rig, cfg.image, cfg.work, fresh_import=cfg.fresh_import, log=log)
        group, ref = bench_image.group, bench_image.ctr_ref
        doc["group"], doc["import"] = group, bench_image.import_doc
        if cfg.probe:
            from rollstack.node.probe import probe_group

            forget_shared_traces(rig.registry.root / "data")
            t = time.perf_counter()
            doc["probe"] = probe_group(rig.registry.url, [group], cfg.command, work=None)
            doc["probe"]["wall_s"] = time.perf_counter() - t
            log(f"probe: exit {doc['probe']['exit_code']}, trace published ({doc['probe']['wall_s']:.1f}s)")
        plan = {"name": "bench-image", "groups": [group], "workdir": "/",
                "resources": {"cpu": 1.0, "memory": "1Gi", "max_cpu": 2.0, "max_memory": "4Gi"}}
        system = RollstackSystem("rollstack", rig.registry.url, cfg.work / "node", rig.link,
                                 **{"max_environments": 16, **cfg.node_options})
        doc["node_options"] = dict(cfg.node_options)
        ctr = rig.ctr
        seq = iter(range(1 << 30))

        def ctd_run(cold: bool) -> dict[str, Any]:
            cid = f"rsii-{int(time.time())}-{next(seq)}"
            t0 = time.perf_counter()
            if not ctr.has_image(ref):
                ctr.pull(ref)
            pulled = time.perf_counter() - t0
            try:
                ctr.create(ref, cid, cmd)
                proc = ctr.start(cid)
            finally:
                ctr.delete(cid)
            return {"kind": "containerd_cold" if cold else "containerd_warm", "first_cmd_s": time.perf_counter() - t0,
                    "pull_s": pulled, "exit_code": proc.returncode, "output": (proc.stdout + proc.stderr)[-300:]}

        def rs_run(kind: str, cold: bool) -> dict[str, Any]:
            c = system.create(dict(plan, name=f"bench-image-{next(seq)}"), cmd, cold)
            return {"kind": kind, "first_cmd_s": c.first_cmd_s, "ready_s": c.ready_s, "exit_code": c.exit_code,
                    "link_bytes": c.link_bytes, "trace_prefetch_chunks": c.trace_prefetch_chunks,
                    "fetch": c.fetch_detail, "phases": c.phases, "output": c.output[-300:]}

        import os

        try:
            if not cfg.probe:
                forget_shared_traces(rig.registry.root / "data")
            first_kind = "rollstack_probed_first" if cfg.probe else "rollstack_first_ever"
            for rnd in range(max(cfg.cold, 1)):
                load = os.getloadavg()[0]
                ctr.clear()
                drop_page_cache()
                samples.append(dict(ctd_run(True), round=rnd, load=load))
                for _ in range(cfg.warm):
                    samples.append(dict(ctd_run(False), round=rnd, load=load))
                system.clear()  # fresh node, page cache dropped
                samples.append(dict(rs_run(first_kind if rnd == 0 else "rollstack_shared_trace", True),
                                    round=rnd, load=load))
                samples.append(dict(rs_run("rollstack_warm_next", False), round=rnd, load=load))
                for _ in range(cfg.warm - 1):
                    samples.append(dict(rs_run("rollstack_warm_next", False), round=rnd, load=load))
                t = time.perf_counter()
                system.settle(900)
                mat_s = time.perf_counter() - t
                for _ in range(cfg.warm):
                    samples.append(dict(rs_run("rollstack_warm_materialized", False), round=rnd, load=load,
                                        materialize_wait_s=mat_s))
                last = [s for s in samples if s["round"] == rnd]
                log(f"round {rnd} (load {load:.1f}): " + ", ".join(f"{s['kind']} {s['first_cmd_s']:.2f}s" for s in last)
                    + f"; materialized {mat_s:.1f}s after")
                bad = [s for s in last if s["exit_code"] != 0]
                if bad:
                    log(f"command failed: {bad[0]['kind']} exit {bad[0]['exit_code']}: {bad[0]['output']}")
            mat = system.node.service.stages.lowers.materializer if system.node is not None else None
            doc["materializer"] = {"stats": mat.stats(), "extracts": mat.extract_stats} if mat is not None else {}
        finally:
            system.stop()
            ctr.clear()
        doc["link"] = rig.link_facts()
    doc["summary"] = summary(samples)
    doc["targets"] = targets(doc["summary"])
    doc["samples"] = samples
    return doc


def _layout_of(image: str, work: Path) -> tuple[Path, str]:
    """An OCI layout + tag holding `image` (a registry image is copied into one with skopeo)."""
    import subprocess

    if image.startswith("oci:"):
        rest = image[4:]
        path, tag = Path(rest), "latest"
        if not path.is_dir() and ":" in rest:
            head, tail = rest.rsplit(":", 1)
            path, tag = Path(head), tail
        return path, tag
    dest = work / "source-layout"
    dest.parent.mkdir(parents=True, exist_ok=True)
    ref = image if image.startswith("docker://") else f"docker://{image}"
    subprocess.run(["skopeo", "copy", "-q", "--src-tls-verify=false", ref, f"oci:{dest}:image"], check=True,
                   capture_output=True)
    return dest, "image"


def markdown(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    imp = doc["import"]
    rows = ["| measure | p50 (s) | min-max (s) | n |", "|---|---:|---:|---:|"]
    for k, v in s.items():
        rows.append(f"| {k} | {v['p50']:.3f} | {v['min']:.3f}-{v['max']:.3f} | {v['n']} |")
    rows.append(f"\nimport: {imp['unpacked_bytes'] / 1e6:.0f} MB unpacked in {imp['seconds']:.1f} s = "
                f"{imp['mb_per_s']:.0f} MB/s; re-import {imp['reimport_seconds']:.2f} s")
    for k, t in doc["targets"].items():
        rows.append(f"target {k}: {t['value']:.3g} (target {t['target']}) -> {'met' if t['met'] else 'MISSED'}")
    return "\n".join(rows)


def shell_command(image: str, command: str) -> str:
    return f"rollstack bench init --image {shlex.quote(image)} --command {shlex.quote(command)} --json"
