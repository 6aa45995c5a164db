"""A verifiers harness plugin for the adapter tests (harness id `rs_scripted_harness`): it runs
in-process (verifiers allows a harness loop outside the box as long as model calls go through the
interception endpoint; this one makes none) and runs the task's `script` commands in the runtime."""

from __future__ import annotations

from verifiers.v1.configs.harness import HarnessConfig
from verifiers.v1.harness import Harness
from verifiers.v1.runtimes import ProgramResult


class ScriptedHarnessConfig(HarnessConfig):
    script: list[str] = []


class ScriptedHarness(Harness[ScriptedHarnessConfig]):
    EXECUTES_CODE = True
    NEEDS_CONTAINER = True

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        outputs = []
        for command in self.config.script:
            result = await runtime.run(["sh", "-c", command], {"RS_HARNESS": "1"})
            outputs.append(result.stdout)
            if result.exit_code != 0:
                return ProgramResult(result.exit_code, "".join(outputs), result.stderr)
        return ProgramResult(0, "".join(outputs), "")


__all__ = ["ScriptedHarness"]
