"""envd's `process.Process` service (Connect protocol) over a sandbox's `ProcessTable`.

Served by the `connectrpc` ASGI application generated into the `e2b` wheel
(`e2b.envd.process.process_connect.ProcessASGIApplication`): it does the Connect framing (5-byte
envelopes, the end-stream message with flag 0x02), both codecs (JSON, which the SDK uses, and
binary protobuf), deadlines (`connect-timeout-ms`), message size limits and error bodies. This
module supplies the handlers. Every error leaves as a `ConnectError` with a fitting code, never
as a traceback (see `rollstack.e2b.rpc`).

Semantics follow envd: `Start` streams a start event (with the pid), data events, one end
event; the command's deadline is the request's `connect-timeout-ms` (the SDK's `timeout`; 0 is
none) and a dropped stream does not end the command. `cmd` `/bin/bash` (what the SDK always
runs) falls back to `/bin/sh` in a sandbox without bash. Not supported: PTYs (`pty`, `Update`)
and the user switch (every process runs as the plan's user).
"""

from __future__ import annotations

import asyncio
import signal as signals
from typing import Any, AsyncIterator

from protobuf import Oneof

from e2b.envd.process import process_pb as pb
from rollstack.e2b.processes import Event, Proc
from rollstack.e2b.rpc import Envd, unimplemented
from rollstack.errors import InvalidRequest

KEEPALIVE_HEADER = "keepalive-ping-interval"
DEFAULT_KEEPALIVE = 30.0
"""Seconds between keepalive events when the client asks for none (bounds how long a stream
whose client went away stays attached)."""
_SIGNALS = {pb.Signal.SIGKILL: signals.SIGKILL, pb.Signal.SIGTERM: signals.SIGTERM}


class ProcessService(Envd):
    async def list(self, request: pb.ListRequest, ctx: Any) -> pb.ListResponse:
        async with self.call(ctx) as box:
            return pb.ListResponse(processes=[_info(p) for p in box.processes.list()])

    def start(self, request: pb.StartRequest, ctx: Any) -> AsyncIterator[pb.StartResponse]:
        return self.stream(ctx, self._start(request, ctx))

    async def _start(self, request: pb.StartRequest, ctx: Any) -> AsyncIterator[pb.StartResponse]:
        box = await self.sandbox(ctx)
        if request.has_field("pty"):
            raise unimplemented("PTYs are not supported by rollstack's envd")
        cfg = request.process or pb.ProcessConfig()
        cmd, args = await self.run(self._shell, box, cfg.cmd, list(cfg.args))
        timeout = ctx.timeout_ms / 1000.0 if ctx.timeout_ms is not None else None
        stdin = request.stdin if request.has_field("stdin") else True
        proc, queue = await self.run(
            box.processes.start, cmd, args, dict(cfg.envs), cfg.cwd if cfg.has_field("cwd") else None,
            request.tag if request.has_field("tag") else None, stdin, timeout, asyncio.get_running_loop())
        async for event in _events(proc, queue, ctx):
            yield pb.StartResponse(event=event)

    def connect(self, request: pb.ConnectRequest, ctx: Any) -> AsyncIterator[pb.ConnectResponse]:
        return self.stream(ctx, self._connect(request, ctx))

    async def _connect(self, request: pb.ConnectRequest, ctx: Any) -> AsyncIterator[pb.ConnectResponse]:
        box = await self.sandbox(ctx)
        proc = _select(box, request.process)
        queue = proc.subscribe(asyncio.get_running_loop())
        async for event in _events(proc, queue, ctx):
            yield pb.ConnectResponse(event=event)

    async def update(self, request: pb.UpdateRequest, ctx: Any) -> pb.UpdateResponse:
        raise unimplemented("PTYs are not supported by rollstack's envd")

    async def send_input(self, request: pb.SendInputRequest, ctx: Any) -> pb.SendInputResponse:
        async with self.call(ctx) as box:
            proc = _select(box, request.process)
            await self.run(_write, proc, request.input)
            return pb.SendInputResponse()

    async def stream_input(self, request: AsyncIterator[pb.StreamInputRequest], ctx: Any) -> pb.StreamInputResponse:
        async with self.call(ctx) as box:
            proc: Proc | None = None
            async for message in request:
                match message.event:
                    case Oneof(field="start", value=start):
                        proc = _select(box, start.process)
                    case Oneof(field="data", value=data):
                        if proc is None:
                            raise InvalidRequest("the input stream must start with a start event")
                        await self.run(_write, proc, data.input)
                    case _:
                        pass  # keepalive
            return pb.StreamInputResponse()

    async def send_signal(self, request: pb.SendSignalRequest, ctx: Any) -> pb.SendSignalResponse:
        async with self.call(ctx) as box:
            sig = _SIGNALS.get(request.signal)
            if sig is None:
                raise InvalidRequest(f"signal {request.signal} is not supported (SIGTERM, SIGKILL)")
            proc = _select(box, request.process)
            await self.run(proc.signal, sig)
            return pb.SendSignalResponse()

    async def close_stdin(self, request: pb.CloseStdinRequest, ctx: Any) -> pb.CloseStdinResponse:
        async with self.call(ctx) as box:
            proc = _select(box, request.process)
            await self.run(proc.control.close_stdin)
            return pb.CloseStdinResponse()

    def _shell(self, box: Any, cmd: str, args: list[str]) -> tuple[str, list[str]]:
        """`/bin/bash` -> `/bin/sh` when the sandbox has no bash (busybox images)."""
        if cmd != "/bin/bash":
            return cmd, args
        if box.has_bash is None:
            box.has_bash = self.service.has_path(box.id, "/bin/bash")
        return (cmd, args) if box.has_bash else ("/bin/sh", args)


def _select(box: Any, selector: pb.ProcessSelector | None) -> Proc:
    match selector.selector if selector is not None else None:
        case Oneof(field="pid", value=pid):
            return box.processes.get(pid=int(pid))
        case Oneof(field="tag", value=tag):
            return box.processes.get(tag=str(tag))
    raise InvalidRequest("a process selector (pid or tag) is required")


def _write(proc: Proc, data: pb.ProcessInput | None) -> None:
    match data.input if data is not None else None:
        case Oneof(field="stdin", value=chunk):
            if not proc.control.open_stdin:
                raise InvalidRequest(f"process {proc.pid} was started without stdin")
            if not proc.control.write_stdin(bytes(chunk)):
                raise InvalidRequest(f"the stdin of process {proc.pid} is closed")
        case Oneof(field="pty"):
            raise unimplemented("PTYs are not supported by rollstack's envd")
        case _:
            raise InvalidRequest("input must carry stdin bytes")


def _info(proc: Proc) -> pb.ProcessInfo:
    cfg: dict[str, Any] = {"cmd": proc.cmd, "args": proc.args, "envs": proc.envs}
    if proc.cwd is not None:
        cfg["cwd"] = proc.cwd
    extra = {"tag": proc.tag} if proc.tag is not None else {}
    return pb.ProcessInfo(config=pb.ProcessConfig(**cfg), pid=proc.pid, **extra)


def _keepalive(ctx: Any) -> float:
    raw = ctx.request_headers.get(KEEPALIVE_HEADER)
    try:
        return min(max(float(raw), 1.0), 300.0) if raw else DEFAULT_KEEPALIVE
    except ValueError:
        return DEFAULT_KEEPALIVE


async def _events(proc: Proc, queue: "asyncio.Queue[Event]", ctx: Any) -> AsyncIterator[pb.ProcessEvent]:
    """start, then data events as they come (keepalives between), then the end event."""
    yield pb.ProcessEvent(event=Oneof("start", pb.ProcessEvent.StartEvent(pid=proc.pid)))
    interval = _keepalive(ctx)
    try:
        while True:
            try:
                event = await asyncio.wait_for(queue.get(), interval)
            except asyncio.TimeoutError:
                yield pb.ProcessEvent(event=Oneof("keepalive", pb.ProcessEvent.KeepAlive()))
                continue
            if event.kind == "data":
                yield pb.ProcessEvent(event=Oneof("data", pb.ProcessEvent.DataEvent(
                    output=Oneof(event.stream, event.data))))
                continue
            end: dict[str, Any] = {"exit_code": event.exit_code, "exited": event.exited, "status": event.status}
            if event.error is not None:
                end["error"] = event.error
            yield pb.ProcessEvent(event=Oneof("end", pb.ProcessEvent.EndEvent(**end)))
            return
    finally:
        proc.unsubscribe(queue)
