"""verifiers (v1): `RollstackRuntime` on a real node. verifiers' own runtime machinery drives it
(bounded shell reads, user views, `alive`, the shielded `stop`, the atexit backstop), and a full
`Agent.run` places a rollout in a borrowed rollstack box: task setup, an in-process harness
running commands in the box, and the task's reward from the plan's clean evaluator."""

from __future__ import annotations

import asyncio

import pytest
import verifiers.v1 as vf
from verifiers.v1.errors import SandboxError
from verifiers.v1.runtimes import SubprocessConfig
from verifiers.v1.runtimes.base import cleanup_at_exit

from adapters_fixtures import FIX_HELLO, busybox_plan
from rollstack import Client
from rollstack.integrations.verifiers import RollstackConfig, RollstackRuntime, evaluator_reward, provision

pytestmark = pytest.mark.integration


def live(node) -> set[str]:
    with Client(node.url, node.token) as client:
        return {e.id for e in client.list() if e.state != "destroying"}  # destroyed: being reclaimed


def config(node, **kw) -> RollstackConfig:
    return RollstackConfig(plan=busybox_plan(), node=node.url, token=node.token, **kw)


def test_runtime_contract(adapter_node) -> None:
    async def go():
        async with provision(config(adapter_node, exec_timeout=5), env={"BOX": "b"}) as box:
            assert box.info.id in live(adapter_node) and box.workdir == "/work/app"
            r = await box.run(["sh", "-c", "cat hello.txt; echo $BOX $ONE $TASK; echo e >&2; exit 4"], {"ONE": "1"})
            assert (r.exit_code, r.stdout, r.stderr) == (4, "bug\nb 1 hello\n", "e\n")
            r = await box.run(["echo", "a b", "$HOME"], {})               # argv, no shell
            assert r.stdout == "a b $HOME\n"
            assert (await box.run(["sleep", "30"], {})).exit_code == 124  # exec_timeout
            await box.write("sub/new.txt", b"x\x00y")                     # relative to the workdir
            assert await box.read("/work/app/sub/new.txt") == b"x\x00y"
            assert await box.read("sub/new.txt", max_bytes=3) == b"x\x00y"  # verifiers' shell read
            with pytest.raises(SandboxError):
                await box.read("sub/new.txt", max_bytes=2)
            with pytest.raises(SandboxError):
                await box.read("missing.txt")
            assert await box.alive()
            view = box.with_env({"BOX": "view"})
            assert (await view.run(["sh", "-c", "echo $BOX"], {})).stdout == "view\n"
            await box.run(["sh", "-c", "echo 'agent:x:1000:1000::/home/agent:/bin/sh' >> /etc/passwd"], {})
            agent = box.with_user("agent", home="/tmp")
            r = await agent.run(["sh", "-c", "id -u; echo $HOME"], {})
            assert r.stdout == "1000\n/tmp\n"
            await agent.write("/tmp/agent.txt", b"a")
            assert (await box.run(["stat", "-c", "%u", "/tmp/agent.txt"], {})).stdout == "1000\n"
            await box.run_background(["sh", "-c", "sleep 1; echo served > /tmp/bg.out"], {}, "bg.log")
            for _ in range(40):
                if (await box.run(["cat", "/tmp/bg.out"], {})).stdout == "served\n":
                    break
                await asyncio.sleep(0.25)
            else:
                log = await box.run(["sh", "-c", "cat bg.log; ls -la /tmp"], {})
                pytest.fail(f"the background process did not outlive its launch: {log}")
            assert await evaluator_reward(box) == 0.0
            return box

    box = asyncio.run(go())
    assert box.info.id not in live(adapter_node) and box.stopped
    with pytest.raises(SandboxError):
        asyncio.run(box.run(["true"], {}))


def test_atexit_backstop_destroys_a_box_whose_stop_never_ran(adapter_node) -> None:
    box = RollstackRuntime(config(adapter_node))
    from verifiers.v1.runtimes.base import register

    register(box)

    async def start_only():
        await box.start()
        await box.client.aclose()   # the loop goes away without stop(), as after a second Ctrl-C

    asyncio.run(start_only())
    assert box.info.id in live(adapter_node)
    cleanup_at_exit()
    assert box.info.id not in live(adapter_node)
    cleanup_at_exit()                # idempotent


def test_bad_plan_is_a_sandbox_error(adapter_node) -> None:
    async def go():
        async with provision(RollstackConfig(plan={"groups": ["os/nope:1"]}, node=adapter_node.url,
                                             token=adapter_node.token)):
            pass

    with pytest.raises(SandboxError, match="group_not_found"):
        asyncio.run(go())


class FixTask(vf.Task):
    async def setup(self, trace, runtime) -> None:
        await runtime.write("/tmp/fix.diff", FIX_HELLO.encode())

    @vf.reward
    async def solved(self, runtime) -> float:
        return await evaluator_reward(runtime)


@pytest.mark.parametrize("script,reward", [
    (["cat hello.txt", "patch -p1 < /tmp/fix.diff"], 1.0),
    (["cat hello.txt"], 0.0),
])
def test_agent_run_in_a_borrowed_rollstack_box(adapter_node, script, reward) -> None:
    harness = {"id": "rs_scripted_harness", "script": script}
    # the runtime *policy* only sizes the interception server (local: no tunnel); the run borrows the box
    agent_config = vf.AgentConfig(model="none", harness=harness, runtime=SubprocessConfig())

    async def go():
        async with vf.Agent(agent_config) as agent:
            async with provision(config(adapter_node)) as box:
                task = FixTask(vf.TaskData(id="hello", prompt="fix hello.txt"))
                trace = await agent.run(task, runtime=box)
                return trace, box.info.id

    trace, box_id = asyncio.run(go())
    assert trace.ok, trace.errors
    assert trace.rewards["solved"].value == reward and trace.reward == reward
    assert trace.agent.runtime.borrowed and trace.agent.runtime.type == "rollstack"
    assert box_id not in live(adapter_node)
