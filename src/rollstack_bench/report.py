"""Benchmark reports: results.json, results.md (markdown table) and PNG plots in one directory.

Pure helpers (`summarize`, `markdown_table`, `init_summary`; percentiles come from
`rollstack.core.stats`) are separate from the writers. Every report carries the machine facts and
the exact command that produced it. Plots use matplotlib's Agg backend (no display): a CDF of init latency per system and an iteration
timeline (one bar per rollout, coloured by phase: init / exec / eval).
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from rollstack.core.stats import percentile

PHASE_COLOURS = {"init": "#d62728", "exec": "#1f77b4", "eval": "#2ca02c", "destroy": "#7f7f7f"}


# -- pure ------------------------------------------------------------------------------------
def summarize(values: Sequence[float]) -> dict[str, float]:
    """n, p50, p95, mean, min, max of a sample."""
    if not values:
        return {"n": 0, "p50": math.nan, "p95": math.nan, "mean": math.nan, "min": math.nan, "max": math.nan}
    return {"n": len(values), "p50": percentile(values, 50), "p95": percentile(values, 95),
            "mean": sum(values) / len(values), "min": min(values), "max": max(values)}


def init_summary(cold: Sequence[float], warm: Sequence[float], fetched_bytes: Sequence[int] = (),
                 stack_bytes: int = 0) -> dict[str, float]:
    """The per-system fields of `bench init --json` (interface.md)."""
    c, w = summarize(cold), summarize(warm)
    frac = (sum(fetched_bytes) / len(fetched_bytes) / stack_bytes) if (fetched_bytes and stack_bytes) else math.nan
    return {"cold_init_p50": c["p50"], "cold_init_p95": c["p95"], "warm_init_p50": w["p50"],
            "warm_init_p95": w["p95"], "cold_runs": c["n"], "warm_runs": w["n"], "fetched_fraction": frac}


def _fmt(v: Any, fmt: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    try:
        return format(v, fmt)
    except (TypeError, ValueError):
        return str(v)


def markdown_table(rows: Mapping[str, Mapping[str, Any]], columns: Sequence[tuple[str, str, str]],
                   first: str = "system") -> str:
    """A markdown table: one row per key of `rows`; columns are (field, header, format spec)."""
    head = "| " + " | ".join([first] + [h for _, h, _ in columns]) + " |"
    sep = "|" + "|".join(["---"] + ["---:" for _ in columns]) + "|"
    body = ["| " + " | ".join([name] + [_fmt(r.get(k), f) for k, _, f in columns]) + " |" for name, r in rows.items()]
    return "\n".join([head, sep, *body]) + "\n"


INIT_COLUMNS = [
    ("cold_init_p50", "cold init p50 (s)", ".3f"), ("cold_init_p95", "cold init p95 (s)", ".3f"),
    ("warm_init_p50", "warm init p50 (s)", ".3f"), ("warm_init_p95", "warm init p95 (s)", ".3f"),
    ("fetched_fraction", "fetched before ready", ".2%"),
]


def _json_safe(doc: Any) -> Any:
    """NaN/inf are not JSON: write them as null."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return None
    if isinstance(doc, dict):
        return {str(k): _json_safe(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [_json_safe(v) for v in doc]
    return doc


# -- machine facts ---------------------------------------------------------------------------
def machine_facts() -> dict[str, Any]:
    """CPU model, cores, memory, kernel, OS: what a reader needs to compare numbers."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    osname = ""
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                osname = line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_bytes": mem, "loadavg": os.getloadavg()[0],
            "kernel": platform.release(),
            "os": osname, "python": platform.python_version(), "hostname": platform.node(),
            "cgroup": "v2" if Path("/sys/fs/cgroup/cgroup.controllers").exists() else "v1",
            "containerd": _version(["containerd", "--version"]), "runc": _version(["runc", "--version"]),
            "exec_agent": _exec_agent(),
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _exec_agent() -> str | None:
    """The rollstack-execd binary environments get as PID 1, or None: catatonit, every exec a
    `runc exec` (a figure measured so is not one of the agent's)."""
    from rollstack.run.initbin import find_execd

    return find_execd()


def _version(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout
        return out.splitlines()[0].strip() if out else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


def current_command() -> str:
    """The exact command line of this process, shell-quoted."""
    argv = list(sys.argv)
    if argv and argv[0].endswith(("/rollstack", "rollstack")):
        argv[0] = "rollstack"
    return shlex.join(argv)


# -- plots -----------------------------------------------------------------------------------
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_cdf(samples: Mapping[str, Sequence[float]], path: Path, title: str = "environment init latency",
             xlabel: str = "seconds (log scale)") -> Path:
    """One empirical CDF line per system."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for name, values in samples.items():
        xs = sorted(v for v in values if v is not None and math.isfinite(v))
        if not xs:
            continue
        ys = [0.0] + [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step([xs[0]] + xs, ys, where="post", label=f"{name} (n={len(xs)}, p50={percentile(xs, 50):.2f}s)")
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of environments")
    ax.set_ylim(0, 1.02)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_timeline(rollouts: Sequence[Mapping[str, Any]], path: Path, title: str = "iteration timeline") -> Path:
    """Horizontal bars: one row per rollout, segments `{"name", "start", "end"}` coloured by phase.

    Each rollout is `{"label": str, "phases": [{"name": "init"|"exec"|"eval"|..., "start": s, "end": s}]}`."""
    plt = _pyplot()
    height = max(2.5, min(12.0, 0.06 * len(rollouts) + 1.5))
    fig, ax = plt.subplots(figsize=(8, height), dpi=120)
    totals: dict[str, float] = {}
    for row, r in enumerate(rollouts):
        for ph in r.get("phases", []):
            dur = float(ph["end"]) - float(ph["start"])
            totals[ph["name"]] = totals.get(ph["name"], 0.0) + dur
            ax.barh(row, dur, left=float(ph["start"]), height=0.8,
                    color=PHASE_COLOURS.get(ph["name"], "#bcbd22"), linewidth=0)
    whole = sum(totals.values()) or 1.0
    handles = [plt.Rectangle((0, 0), 1, 1, color=PHASE_COLOURS.get(n, "#bcbd22")) for n in totals]
    ax.legend(handles, [f"{n} ({t / whole:.0%})" for n, t in totals.items()], loc="upper right", fontsize=8)
    ax.set_xlabel("seconds since iteration start")
    ax.set_ylabel("rollout")
    ax.set_title(title)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def phase_shares(rollouts: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Fraction of summed rollout time spent in each phase."""
    totals: dict[str, float] = {}
    for r in rollouts:
        for ph in r.get("phases", []):
            totals[ph["name"]] = totals.get(ph["name"], 0.0) + float(ph["end"]) - float(ph["start"])
    whole = sum(totals.values())
    return {k: (v / whole if whole else math.nan) for k, v in totals.items()}


# -- the results directory ------------------------------------------------------------------
def write_results(out_dir: Path, doc: Mapping[str, Any], *, command: str | None = None,
                  title: str = "benchmark", columns: Sequence[tuple[str, str, str]] = INIT_COLUMNS,
                  init_samples: Mapping[str, Sequence[float]] | None = None,
                  timeline: Sequence[Mapping[str, Any]] | None = None,
                  notes: Sequence[str] = ()) -> dict[str, str]:
    """Write results.json, results.md and the plots; returns {kind: path}.

    `doc["systems"]` (name -> fields) becomes the table; `machine` and `command` are added when
    missing. `init_samples` (system -> seconds) draws init_cdf.png; `timeline` draws
    iteration_timeline.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    full = dict(doc)
    full.setdefault("machine", machine_facts())
    full.setdefault("command", command or current_command())
    written: dict[str, str] = {}
    plots: list[tuple[str, str]] = []
    if init_samples:
        p = plot_cdf(init_samples, out_dir / "init_cdf.png")
        plots.append(("init latency CDF", p.name))
        written["init_cdf"] = str(p)
    if timeline:
        p = plot_timeline(timeline, out_dir / "iteration_timeline.png")
        plots.append(("iteration timeline", p.name))
        written["timeline"] = str(p)
        full.setdefault("phase_shares", phase_shares(timeline))
    (out_dir / "results.json").write_text(json.dumps(_json_safe(full), indent=2, default=str) + "\n")
    written["json"] = str(out_dir / "results.json")
    md = [f"# {title}\n", f"Command: `{full['command']}`\n"]
    m = full["machine"]
    md.append(f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, "
              f"{(m.get('memory_bytes') or 0) / 2**30:.0f} GiB, Linux {m.get('kernel', '?')}, "
              f"cgroup {m.get('cgroup', '?')} ({m.get('time_utc', '')})\n")
    if full.get("link"):
        md.append(f"Link: {_link_line(full['link'])}\n")
    if full.get("systems"):
        md.append(markdown_table(full["systems"], columns))
    for label, name in plots:
        md.append(f"![{label}]({name})\n")
    md.extend(f"- {n}" for n in notes)
    (out_dir / "results.md").write_text("\n".join(md) + "\n")
    written["markdown"] = str(out_dir / "results.md")
    return written


def _link_line(link: Mapping[str, Any]) -> str:
    rate = link.get("rate_bit")
    rtt = link.get("rtt_s")
    s = f"profile {link.get('profile', '?')}"
    if rate:
        s += f", {rate / 1e9:g} Gbit/s"
    if rtt is not None:
        s += f", {rtt * 1e3:g} ms RTT"
    if link.get("measured"):
        meas = link["measured"]
        s += f" (measured {meas.get('throughput_bit', 0) / 1e9:.2f} Gbit/s, {meas.get('rtt_s', 0) * 1e3:.2f} ms)"
    return s
