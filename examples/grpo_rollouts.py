#!/usr/bin/env python3
"""GRPO rollouts against a rollstack node: N tasks x K rollouts, rewards from the plan's evaluator.

    # the demo corpus (rollstack bench corpus build --small; publish it; start a node on its store)
    python examples/grpo_rollouts.py --n-tasks 32 --k 8 --concurrency 8 --policy random

    # your own tasks (SWE-smith schema, JSONL) and your own stack layout
    python examples/grpo_rollouts.py --tasks tasks.jsonl --plan-template template.yaml

Each group is one task's K rollouts; the report gives their rewards, mean/std and GRPO advantages,
the outcome counts (retries on registry_unavailable / insufficient_capacity, resamples after
oom_terminated, groups given up on plan_invalid) and where environment time went (init / exec /
eval). `--json` prints the whole report as one JSON document. Node and token default to
$ROLLSTACK_NODE / $ROLLSTACK_TOKEN / the node's token file. The logic lives in
`rollstack.integrations.grpo`; plug your own policy in with `--policy module.Class`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from rollstack.errors import RollstackError
from rollstack.integrations.grpo import RetryPolicy, results_json, run_batch
from rollstack.integrations.policies import make_policy
from rollstack.integrations.tasks import corpus_planner, load_tasks, load_template, template_planner


def default_tasks() -> Path:
    try:
        from rollstack_corpus.build import corpus_dir

        return corpus_dir("small") / "tasks.jsonl"
    except ImportError:
        return Path("tasks.jsonl")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=Path, default=None, help="task file, SWE-smith schema (default: the demo corpus)")
    ap.add_argument("--plan-template", type=Path, default=None, help="plan template YAML (default: see --corpus)")
    ap.add_argument("--corpus", type=Path, default=None,
                    help="built corpus directory whose manifest maps tasks to plans (default: the task file's "
                         "directory if it holds manifest.json, else the demo corpus template)")
    ap.add_argument("--node", default=None, help="node URL (default $ROLLSTACK_NODE or http://127.0.0.1:7878)")
    ap.add_argument("--token", default=None, help="node token (default $ROLLSTACK_TOKEN or the node's token file)")
    ap.add_argument("--n-tasks", type=int, default=32, help="tasks (groups); fewer if the file has fewer")
    ap.add_argument("--k", type=int, default=8, help="rollouts per task (group size)")
    ap.add_argument("--concurrency", type=int, default=8, help="environments alive at once")
    ap.add_argument("--policy", default="scripted", help="scripted | random | module.Class")
    ap.add_argument("--p-fix", type=float, default=0.5, help="random policy: probability of applying the fix")
    ap.add_argument("--step-timeout", type=float, default=600.0, help="seconds per command")
    ap.add_argument("--max-retries", type=int, default=6, help="retries of a call on a transient error")
    ap.add_argument("--max-resamples", type=int, default=2, help="fresh environments per rollout after an OOM")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print the report as one JSON document")
    ap.add_argument("--results", type=Path, default=None, help="also write every rollout's record here (JSON)")
    return ap.parse_args(argv)


def choose_planner(args: argparse.Namespace, tasks_path: Path):
    """(planner, description): --plan-template, else --corpus / the task file's corpus, else DEMO_TEMPLATE."""
    if args.plan_template is not None:
        return template_planner(load_template(args.plan_template)), f"template {args.plan_template}"
    corpus = args.corpus or (tasks_path.parent if (tasks_path.parent / "manifest.json").is_file() else None)
    if corpus is not None:
        return corpus_planner(corpus), f"corpus {corpus}"
    return template_planner(None), "demo template"


def print_report(report: dict, out=sys.stdout) -> None:
    w = out.write
    w(f"{'group':<44} {'ok':>3} {'mean':>6} {'std':>6}  rewards / advantages\n")
    for g in report["groups"]:
        mean = "-" if g["mean"] is None else f"{g['mean']:.3f}"
        std = "-" if g["std"] is None else f"{g['std']:.3f}"
        rewards = " ".join(f"{r:g}" for r in g["rewards"])
        adv = " ".join(f"{a:+.2f}" for a in g["advantages"])
        note = f"  [{g['failed']} failed, {g['gave_up']} gave up: {','.join(g['errors'])}]" if g["errors"] else ""
        w(f"{g['instance_id'][:44]:<44} {g['ok']:>3} {mean:>6} {std:>6}  [{rewards}] / [{adv}]{note}\n")
    r = report["rollouts"]
    w(f"\nrollouts: {r['ok']}/{r['total']} ok, {r['failed']} failed, {r['gave_up']} gave up, "
      f"{r['resampled']} resampled, {r['requeued']} requeued, retries {r['retries'] or '{}'}, mean reward {r['mean_reward']}\n")
    w("environment time (successful rollouts):\n")
    for phase, p in report["env_time"].items():
        w(f"  {phase:<5} total {p['total']:8.2f}s  mean {p['mean']:7.3f}s  p50 {p['p50']:7.3f}s  "
          f"p95 {p['p95']:7.3f}s  share {100 * p['share']:5.1f}%\n")
    w(f"  node-reported init p50 {report['node_init_p50']:.3f}s; wall {report['wall_seconds']:.1f}s\n")


async def main_async(args: argparse.Namespace) -> dict:
    from rollstack import AsyncClient

    tasks_path = args.tasks or default_tasks()
    tasks = load_tasks(tasks_path)
    if len(tasks) < args.n_tasks:
        print(f"[grpo] {tasks_path} has {len(tasks)} tasks; running all of them", file=sys.stderr)
    tasks = tasks[: args.n_tasks]
    policy = make_policy(args.policy, p_fix=args.p_fix, step_timeout=args.step_timeout)
    planner, plans_from = choose_planner(args, tasks_path)
    retry = RetryPolicy(max_retries=args.max_retries, max_resamples=args.max_resamples)
    async with AsyncClient(args.node, args.token) as client:
        report, groups = await run_batch(
            client, tasks, args.k, policy,
            concurrency=args.concurrency, retry=retry, planner=planner,
            seed=args.seed, log=lambda m: print(f"[grpo] {m}", file=sys.stderr),
        )
    report["config"] = {"tasks": str(tasks_path), "plans": plans_from, "n_tasks": len(tasks), "k": args.k, "policy": policy.name,
                        "concurrency": args.concurrency, "seed": args.seed}
    if args.results:
        args.results.write_text(json.dumps(results_json(groups), indent=1))
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = asyncio.run(main_async(args))
    except RollstackError as exc:
        print(f"error: {exc.code}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # asyncio.run cancelled the rollouts; their environments were destroyed
        print("interrupted", file=sys.stderr)
        return 130
    except (OSError, ValueError, ImportError, AttributeError) as exc:  # bad file, policy name...
        print(f"error: invalid_request: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report))
    else:
        print_report(report)
    return 0 if report["rollouts"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
