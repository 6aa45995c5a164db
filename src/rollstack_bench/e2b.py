"""`rollstack bench e2b`: what the E2B-compatible API costs over the native one, with the real SDK.

A node agent (its own temporary root, the busybox corpus, a plan published as template
`bench/app:1`) is driven by the unmodified `e2b` SDK and, in the same run, by rollstack's own
client: warm sandbox create -> first command, `commands.run("true")` against `/v1` `exec true`,
a 1 MiB file write+read round trip, and create/run/kill cycles followed by a leak check (mounts,
env dirs, runc state, cgroups, processes of those sandboxes).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer

TEMPLATE = "bench/app:1"


def _log(msg: str) -> None:
    print(f"[bench e2b] {msg}", file=sys.stderr, flush=True)


def run_bench(n: int, runs: int, cycles: int, keep: bool = False) -> dict[str, Any]:
    from e2b import Sandbox

    from rollstack_bench.env import busybox_plan, leak_check, publish_busybox_corpus
    from rollstack_bench.report import current_command, machine_facts, summarize
    from rollstack.client import Client
    from rollstack.node import agent
    from rollstack.node.config import NodeConfig
    from rollstack.node.server import free_port
    from rollstack.plan.published import publish_plan
    from rollstack.store import open_store

    base = Path(tempfile.mkdtemp(prefix="rollstack-bench-e2b-", dir="/var/tmp"))
    config = NodeConfig(root=base / "node", listen=f"127.0.0.1:{free_port()}", max_environments=16)
    ids: set[str] = set()
    try:
        _log("publishing the busybox corpus and the template")
        spec = publish_busybox_corpus(base / "store", base / "build")
        store = open_store(spec)
        try:
            publish_plan(store, TEMPLATE, busybox_plan())
        finally:
            store.close()
        config = config.model_copy(update={"store": spec})
        agent.start(config)
        token = config.token_path.read_text().strip()
        opts: dict[str, Any] = {"api_url": config.url(), "sandbox_url": config.url(), "api_key": token}

        _log("warming the caches")
        box = Sandbox.create(TEMPLATE, timeout=300, **opts)
        ids.add(box.sandbox_id)
        box.commands.run("true")
        box.kill()

        _log(f"sandbox create -> first command x{n}")
        create, first = [], []
        for _ in range(n):
            t = time.perf_counter()
            box = Sandbox.create(TEMPLATE, timeout=300, **opts)
            create.append(time.perf_counter() - t)
            box.commands.run("true")
            first.append(time.perf_counter() - t)
            ids.add(box.sandbox_id)
            box.kill()

        _log(f"commands.run('true') vs /v1 exec true, x{runs} each")
        box = Sandbox.create(TEMPLATE, timeout=600, **opts)
        ids.add(box.sandbox_id)
        try:
            box.commands.run("true")
            sdk_run = []
            for _ in range(runs):
                t = time.perf_counter()
                box.commands.run("true")
                sdk_run.append(time.perf_counter() - t)
            payload = bytes(range(256)) * 4096  # 1 MiB
            files = []
            for i in range(n):
                t = time.perf_counter()
                box.files.write(f"/tmp/blob{i}", payload)
                assert bytes(box.files.read(f"/tmp/blob{i}", format="bytes")) == payload
                files.append(time.perf_counter() - t)
        finally:
            box.kill()
        with Client(config.url(), token=token) as client, client.create(busybox_plan()) as env:
            ids.add(env.id)
            env.exec(["true"])
            native = []
            for _ in range(runs):
                t = time.perf_counter()
                env.exec(["true"])
                native.append(time.perf_counter() - t)

        _log(f"{cycles} create/run/kill cycles")
        t = time.perf_counter()
        for _ in range(cycles):
            box = Sandbox.create(TEMPLATE, timeout=120, **opts)
            ids.add(box.sandbox_id)
            box.commands.run("echo x > /tmp/f; sleep 60 &", background=False)
            box.commands.run("sleep 60", background=True)
            box.kill()
        cycle_s = time.perf_counter() - t
        cycles_doc = leak_check(config.root, ids, cycles, cycle_s, settle_s=10)
        return {
            "sandbox_create": summarize(create),
            "sandbox_create_to_first_command": summarize(first),
            "commands_run_true_sdk": summarize(sdk_run),
            "exec_true_native_v1": summarize(native),
            "file_write_read_1mib": summarize(files),
            "cycles": cycles_doc,
            "sdk": "e2b==" + _version(),
            "machine": machine_facts(),
            "command": current_command(),
        }
    finally:
        try:
            agent.stop(config)
        finally:
            if not keep:
                shutil.rmtree(base, ignore_errors=True)


def _version() -> str:
    from importlib.metadata import version

    return version("e2b")


def _human(doc: dict[str, Any]) -> None:
    from rollstack_bench.env import cycles_line

    def ms(s: dict[str, Any]) -> str:
        return f"p50 {s['p50'] * 1000:.0f} ms  p95 {s['p95'] * 1000:.0f} ms"

    print(f"{doc['sdk']}; command: {doc['command']}")
    print(f"sandbox create              {ms(doc['sandbox_create'])}")
    print(f"create -> first command     {ms(doc['sandbox_create_to_first_command'])}")
    print(f"commands.run('true') (SDK)  {ms(doc['commands_run_true_sdk'])}")
    print(f"exec true (/v1, same run)   {ms(doc['exec_true_native_v1'])}")
    print(f"1 MiB write + read          {ms(doc['file_write_read_1mib'])}")
    print(cycles_line(doc["cycles"], "create/run/kill"))


def register(app: typer.Typer) -> None:
    @app.command("e2b")
    def bench_e2b(
        as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
        n: Annotated[int, typer.Option("--n", help="create->first command and file samples")] = 20,
        runs: Annotated[int, typer.Option("--runs", help="`true` command samples per API")] = 100,
        cycles: Annotated[int, typer.Option("--cycles", help="create/run/kill cycles for the leak check")] = 30,
        keep: Annotated[bool, typer.Option("--keep", help="keep the temporary root")] = False,
    ) -> None:
        """The E2B API with the real SDK vs the native API: create, command, file latency; leaks."""
        from rollstack.cli.output import emit

        emit(run_bench(n, runs, cycles, keep), as_json, _human)
