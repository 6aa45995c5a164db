"""`rollstack env ...` and `rollstack run`: environments on a node agent, through the SDK's `Client`.

Every command takes `--node` (env ROLLSTACK_NODE) and `--token` (env ROLLSTACK_TOKEN; default the
token file in the node's root). `env exec` and `run` stream the command's output and exit with its
exit code.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from rollstack.cli.output import emit, stdout

if TYPE_CHECKING:
    from rollstack.client._handles import Environment
    from rollstack.client._clients import Client

app = typer.Typer(no_args_is_help=True, help="Environments on a node agent: create, fork, pause, resume, exec, cp, diff, evaluate, ls, rm, stats.")

NodeOpt = Annotated[Optional[str], typer.Option("--node", envvar="ROLLSTACK_NODE", help="node agent URL [default: http://127.0.0.1:7878]")]
TokenOpt = Annotated[Optional[str], typer.Option("--token", envvar="ROLLSTACK_TOKEN", help="bearer token [default: the token file in the node's root]")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document")]
Cmd = Annotated[list[str], typer.Argument(help="the command (after --)", show_default=False)]


def node_client(node: str | None, token: str | None, lease: float | None = None) -> "Client":
    """A client without a lease by default: what a command creates outlives the command (it
    lives its plan's lifetime) so that a later `env exec` still finds it."""
    from rollstack.client._clients import Client

    return Client(node, token, lease=lease)


@app.command("create")
def create(
    plan: Path,
    count: Annotated[Optional[int], typer.Option(
        "--count", min=1, max=256, help="N environments of the plan in one call (a GRPO group)")] = None,
    idempotency_key: Annotated[Optional[str], typer.Option(
        "--idempotency-key", help="a retry with the same key returns the same environment(s), not new ones")] = None,
    node: NodeOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create an environment from PLAN; print its id, per-phase timings and fetch statistics.
    With --count N: N environments (all or none), one id per line; --json prints a list."""
    with node_client(node, token) as client:
        if count is None:
            env = client.create(plan, idempotency_key=idempotency_key)
            assert env.created is not None
            emit(env.created.model_dump(mode="json"), as_json, _print_created)
            return
        envs = client.create(plan, count=count, idempotency_key=idempotency_key)
    docs = [e.created.model_dump(mode="json") for e in envs if e.created is not None]
    emit(docs, as_json, lambda ds: [_print_created(d) for d in ds])


@app.command("fork")
def fork(
    env_id: Annotated[str, typer.Argument(metavar="ID")],
    count: Annotated[int, typer.Option("--count", min=1, max=256, help="children to make (all or none)")] = 1,
    node: NodeOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """N new environments whose filesystem is ID's now (ID runs on unchanged; processes are not
    carried over: docs/fork.md). One id per line; --json prints the create documents."""
    with node_client(node, token) as client:
        kids = client.get(env_id).fork(count)
    docs = [k.created.model_dump(mode="json") for k in kids if k.created is not None]
    emit(docs, as_json, lambda ds: [_print_created(d) for d in ds])


@app.command("pause")
def pause(env_id: Annotated[str, typer.Argument(metavar="ID")], node: NodeOpt = None, token: TokenOpt = None,
          as_json: JsonOpt = False,
          checkpoint: Annotated[bool, typer.Option("--checkpoint", help="dump its processes to disk with "
                                                   "CRIU and end them instead of freezing them")] = False) -> None:
    """Freeze ID's processes and give its quotas back to the node (docs/fork.md)."""
    _set_state(env_id, "checkpoint" if checkpoint else "pause", node, token, as_json)


@app.command("resume")
def resume(env_id: Annotated[str, typer.Argument(metavar="ID")], node: NodeOpt = None, token: TokenOpt = None,
           as_json: JsonOpt = False) -> None:
    """Thaw a paused ID (insufficient_capacity while the node cannot take its quotas back)."""
    _set_state(env_id, "resume", node, token, as_json)


def _set_state(env_id: str, call: str, node: str | None, token: str | None, as_json: bool) -> None:
    with node_client(node, token) as client:
        env = client.get(env_id)
        info = env.resume() if call == "resume" else env.pause("checkpoint" if call == "checkpoint" else "freeze")
    emit(info.model_dump(mode="json"), as_json, lambda d: stdout.print(f"{d['id']} {d['state']}"))


def _print_created(doc: dict[str, Any]) -> None:
    t, f = doc["timings"], doc["fetch"]
    stdout.print(doc["id"])
    phases = " ".join(f"{k}={t[k]:.3f}s" for k in ("resolve", "toc", "mount", "mutation", "start", "total"))
    print(phases, file=sys.stderr)
    print(f"fetched {f['fetched_bytes']} of {f['stack_bytes']} stack bytes", file=sys.stderr)


@app.command("exec")
def exec_(
    env_id: Annotated[str, typer.Argument(metavar="ID")],
    cmd: Cmd,
    timeout: Annotated[Optional[float], typer.Option(help="seconds; the process tree is killed after")] = None,
    cwd: Annotated[Optional[str], typer.Option(help="working directory inside the environment")] = None,
    node: NodeOpt = None,
    token: TokenOpt = None,
) -> None:
    """Run CMD in environment ID, streaming its output; exit with its exit code."""
    with node_client(node, token) as client:
        code = _stream(client.get(env_id), cmd, timeout, cwd)
    raise typer.Exit(code)


def _stream(env: "Environment", cmd: list[str], timeout: float | None, cwd: str | None) -> int:
    result = None
    for chunk in env.exec_stream(cmd, timeout=timeout, cwd=cwd):
        if chunk.type == "stdout":
            sys.stdout.write(chunk.data or "")
            sys.stdout.flush()
        elif chunk.type == "stderr":
            sys.stderr.write(chunk.data or "")
            sys.stderr.flush()
        elif chunk.type == "result":
            result = chunk.result
    if result is None:
        return 1
    if result.timed_out:
        print(f"error: exec_timeout: command timed out after {timeout}s", file=sys.stderr)
    if result.truncated:
        print("warning: output truncated", file=sys.stderr)
    return result.exit_code


@app.command("cp")
def cp(
    src: Annotated[str, typer.Argument(help="ID:/path or a local path ('-' for stdin)")],
    dst: Annotated[str, typer.Argument(help="ID:/path or a local path ('-' for stdout)")],
    node: NodeOpt = None,
    token: TokenOpt = None,
) -> None:
    """Copy a file into or out of an environment (`ID:/path` names the environment side)."""
    s, d = _split(src), _split(dst)
    if (s is None) == (d is None):
        from rollstack.errors import InvalidRequest

        raise InvalidRequest("exactly one of SRC and DST must be ID:/path")
    with node_client(node, token) as client:
        if s is not None:
            data = client.get(s[0]).read_file(s[1])
            if dst == "-":
                sys.stdout.buffer.write(data)
                sys.stdout.flush()
            else:
                Path(dst).write_bytes(data)
        else:
            assert d is not None
            data = sys.stdin.buffer.read() if src == "-" else _read_local(src)
            client.get(d[0]).write_file(d[1], data)


def _split(spec: str) -> tuple[str, str] | None:
    env_id, sep, path = spec.partition(":")
    if not sep or not path.startswith("/") or "/" in env_id or not env_id:
        return None
    return env_id, path


def _read_local(path: str) -> bytes:
    from rollstack.errors import InvalidRequest

    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InvalidRequest(f"cannot read {path}: {exc.strerror or exc}") from exc


@app.command("diff")
def diff(
    env_id: Annotated[str, typer.Argument(metavar="ID")],
    binary: Annotated[bool, typer.Option("--binary", help="binary files as git binary patches (default: named only)")] = False,
    node: NodeOpt = None,
    token: TokenOpt = None,
) -> None:
    """The environment's changes as a unified diff."""
    with node_client(node, token) as client:
        sys.stdout.write(client.get(env_id).diff("patch" if binary else "name"))
        sys.stdout.flush()


@app.command("evaluate")
def evaluate(
    env_id: Annotated[str, typer.Argument(metavar="ID")], node: NodeOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Score the environment: the plan's evaluator in a fresh clean environment with this diff applied."""
    with node_client(node, token) as client:
        result = client.get(env_id).evaluate()
    emit(result.model_dump(mode="json"), as_json, lambda d: stdout.print(f"reward {d['reward']} (exit code {d['exit_code']})"))


@app.command("ls")
def ls(node: NodeOpt = None, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """The node's environments."""
    with node_client(node, token) as client:
        envs = [e.model_dump(mode="json") for e in client.list()]
    emit({"environments": envs}, as_json, _print_list)


def _print_list(doc: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table("id", "state", "plan", "age (s)", "lease (s)", "cpu", "memory")
    for e in doc["environments"]:
        q = e.get("quotas") or {}
        lease = "" if e.get("lease_remaining") is None else f"{e['lease_remaining']:.0f}"
        table.add_row(e["id"], e["state"], e.get("plan_name") or "", f"{e['age']:.0f}", lease,
                      str(q.get("cpu_limit") or ""), str(q.get("memory_limit") or ""))
    stdout.print(table)


@app.command("rm")
def rm(env_ids: Annotated[list[str], typer.Argument(metavar="ID...")], node: NodeOpt = None, token: TokenOpt = None) -> None:
    """Destroy environments, reclaiming everything."""
    with node_client(node, token) as client:
        for env_id in env_ids:
            client.destroy(env_id)


@app.command("stats")
def stats(
    env_id: Annotated[str, typer.Argument(metavar="ID")], node: NodeOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Resource usage and quota history, and provisioning events."""
    with node_client(node, token) as client:
        doc = client.get(env_id).stats().model_dump(mode="json")
    emit(doc, as_json, _print_stats)


def _print_stats(doc: dict[str, Any]) -> None:
    hist = doc.get("history") or []
    stdout.print(f"state {doc.get('state')}; {len(hist)} samples, {len(doc.get('events') or [])} events")
    for s in hist[-10:]:
        stdout.print(f"t={s['t']:.1f}s cpu {s.get('cpu_usage')}/{s.get('cpu_limit')} mem {s.get('memory_usage')}/{s.get('memory_limit')}")
    for e in (doc.get("events") or [])[-10:]:
        stdout.print(str(e))


def register_top_level(root: typer.Typer) -> None:
    """Adds `rollstack run PLAN -- CMD...` to the root app."""

    @root.command("run")
    def run(
        plan: Path,
        cmd: Cmd,
        timeout: Annotated[Optional[float], typer.Option(help="seconds for the command")] = None,
        cwd: Annotated[Optional[str], typer.Option(help="working directory inside the environment")] = None,
        node: NodeOpt = None,
        token: TokenOpt = None,
    ) -> None:
        """Create an environment from PLAN, run CMD in it (streaming), destroy it; exit with CMD's code."""
        from rollstack.client.leases import DEFAULT_LEASE

        with node_client(node, token, lease=DEFAULT_LEASE) as client:  # reaped soon if this command is killed
            with client.create(plan) as env:
                code = _stream(env, cmd, timeout, cwd)
        raise typer.Exit(code)
