#!/usr/bin/env python3
"""One scripted episode through each framework adapter (slime, SkyRL-gym, verifiers) on a node.

    python examples/adapters_demo.py --plan plan.yaml [--fix fix.diff] [--command 'ls'] \
        [--only slime,skyrl,verifiers] [--node URL] [--token T] [--json]

Each adapter gets a fresh environment from the plan (a file, or a published NAME:TAG), runs
`--command`, applies `--fix` (a unified diff relative to the plan's workdir: `git apply`, else
`patch -p1`) when given, and scores with the plan's evaluator:
- slime: `RollstackSandbox` (exec / write_file / read_file, slime's protocol), `evaluate()`;
- skyrl: `skyrl_gym.make("rollstack")`, model outputs as ```bash blocks, then the submit marker;
- verifiers: `provision(RollstackConfig(...))`, `runtime.run` / `write`, `evaluator_reward`.
Prints one line per adapter (environment, command output head, reward), or `--json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from rollstack.errors import RollstackError

FIX_PATH = "/tmp/rollstack-fix.diff"
APPLY = f"git apply {FIX_PATH} 2>/dev/null || patch -p1 < {FIX_PATH}"
ADAPTERS = ("slime", "skyrl", "verifiers")


async def slime(args: argparse.Namespace, fix: str | None) -> dict[str, Any]:
    from rollstack.integrations.slime import RollstackSandbox

    async with RollstackSandbox(args.plan, node=args.node, token=args.token) as sb:
        rc, out, err = await sb.exec(args.command, timeout=args.timeout)
        if fix is not None:
            await sb.write_file(FIX_PATH, fix)
            await sb.exec(APPLY, timeout=args.timeout, check=True)
        reward = (await sb.evaluate()).reward
        return {"environment": sb.sandbox_id, "exit_code": rc, "output": out + err, "reward": reward}


def skyrl(args: argparse.Namespace, fix: str | None) -> dict[str, Any]:
    import skyrl_gym

    from rollstack.integrations.episode import SUBMIT_MARKER
    from rollstack.integrations.skyrl import register

    register()
    env = skyrl_gym.make("rollstack", env_config={"node": args.node, "token": args.token, "max_turns": 10,
                                                  "step_timeout": args.timeout},
                         extras={"plan": args.plan})
    try:
        _, info = env.init([{"role": "user", "content": "Fix the bug."}])
        first = env.step(f"```bash\n{args.command}\n```")
        if fix is not None:
            heredoc = f"cat > {FIX_PATH} <<'ROLLSTACK_EOF'\n{fix}ROLLSTACK_EOF\n{APPLY}"
            env.step(f"```bash\n{heredoc}\n```")
        last = env.step(f"```bash\necho {SUBMIT_MARKER}\n```")
        output = first["observations"][0]["content"] if first["observations"] else ""
        return {"environment": info["environment_id"], "exit_code": first["metadata"].get("returncode"),
                "output": output, "reward": last["reward"], "done": last["done"]}
    finally:
        env.close()


async def verifiers(args: argparse.Namespace, fix: str | None) -> dict[str, Any]:
    from rollstack.integrations.verifiers import RollstackConfig, evaluator_reward, provision

    async with provision(RollstackConfig(plan=args.plan, node=args.node, token=args.token,
                                         exec_timeout=args.timeout)) as box:
        result = await box.run(["sh", "-c", args.command], {})
        if fix is not None:
            await box.write(FIX_PATH, fix.encode())
            applied = await box.run(["sh", "-c", APPLY], {})
            if applied.exit_code != 0:
                raise SystemExit(f"error: the fix did not apply: {applied.stderr.strip()}")
        return {"environment": box.info.id, "exit_code": result.exit_code,
                "output": result.stdout + result.stderr, "reward": await evaluator_reward(box)}


def adapter_errors() -> tuple[type[BaseException], ...]:
    """What a failed run raises: rollstack's errors, and verifiers' SandboxError (which wraps them)."""
    try:
        from verifiers.v1.errors import SandboxError
    except ImportError:
        return (RollstackError,)
    return (RollstackError, SandboxError)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", required=True, help="plan file or published NAME:TAG")
    ap.add_argument("--fix", type=Path, default=None, help="a unified diff to apply before scoring")
    ap.add_argument("--command", default="ls", help="the agent's command (default: ls)")
    ap.add_argument("--only", default=",".join(ADAPTERS), help="comma-separated subset of " + ",".join(ADAPTERS))
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per command")
    ap.add_argument("--node", default=None, help="node URL (default $ROLLSTACK_NODE)")
    ap.add_argument("--token", default=None, help="bearer token (default $ROLLSTACK_TOKEN / the node's token file)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    chosen = [a.strip() for a in args.only.split(",") if a.strip()]
    unknown = sorted(set(chosen) - set(ADAPTERS))
    if unknown or not chosen:
        print(f"error: invalid_request: --only takes {','.join(ADAPTERS)}, not {','.join(unknown) or 'nothing'}",
              file=sys.stderr)
        return 1
    try:
        fix = args.fix.read_text() if args.fix is not None else None
        results: dict[str, Any] = {}
        for name in chosen:
            t0 = time.monotonic()
            if name == "skyrl":
                results[name] = skyrl(args, fix)
            else:
                results[name] = asyncio.run(slime(args, fix) if name == "slime" else verifiers(args, fix))
            results[name]["seconds"] = round(time.monotonic() - t0, 3)
    except OSError as exc:
        print(f"error: invalid_request: {exc}", file=sys.stderr)
        return 1
    except adapter_errors() as exc:
        print(f"error: {getattr(exc, 'code', 'sandbox_error')}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for name, r in results.items():
            head = shlex.quote(r["output"].strip().splitlines()[0][:60]) if r["output"].strip() else "''"
            print(f"{name:10} env {r['environment']}  exit {r['exit_code']}  output {head}  "
                  f"reward {r['reward']:.1f}  {r['seconds']:.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
