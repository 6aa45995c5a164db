#!/usr/bin/env python3
"""Print the plan (YAML) for one task of a SWE-smith task file, e.g. for mini-swe-agent's `plan:`.

    python examples/task_to_plan.py [--tasks tasks.jsonl] [--plan-template t.yaml] [INSTANCE_ID] > plan.yaml

Without INSTANCE_ID, the first task. The bug (`patch`) is inline as `mutation_text`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from rollstack.errors import RollstackError
from rollstack.integrations.tasks import load_tasks, load_template, task_plan


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("instance_id", nargs="?")
    ap.add_argument("--tasks", type=Path, default=None, help="task file (default: the demo corpus)")
    ap.add_argument("--plan-template", type=Path, default=None, help="plan template YAML (default: the demo corpus layout)")
    args = ap.parse_args(argv)
    try:
        if args.tasks is None:
            from rollstack_corpus.build import corpus_dir

            args.tasks = corpus_dir("small") / "tasks.jsonl"
        tasks = load_tasks(args.tasks)
        chosen = [t for t in tasks if args.instance_id in (None, t.instance_id)][:1]
        if not chosen:
            print(f"error: not_found: no task {args.instance_id!r} in {args.tasks}", file=sys.stderr)
            return 1
        plan = task_plan(chosen[0], load_template(args.plan_template))
    except RollstackError as exc:
        print(f"error: {exc.code}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: invalid_request: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(yaml.safe_dump(plan, sort_keys=False, width=1000))
    return 0


if __name__ == "__main__":
    sys.exit(main())
