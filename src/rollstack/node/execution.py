"""Exec glue: a request -> the runtime's exec, its result -> the wire model, and the streaming form.

Streaming runs the blocking exec in its own thread with an `on_output` callback feeding a queue;
the iterator yields output chunks as they arrive (decoded incrementally, so a UTF-8 sequence split
across reads is never mangled), then exactly one `result` chunk, or re-raises the exec's error.
"""

from __future__ import annotations

import codecs
import queue
import threading
from typing import Any, Callable, Iterator

from rollstack.contract.models import ExecChunk, ExecResult

OnOutput = Callable[[str, bytes], None]
RunExec = Callable[[OnOutput | None], Any]
"""Runs the exec (blocking) with an optional output callback; returns the runtime's ExecResult."""

_END = object()


def to_wire(result: Any) -> ExecResult:
    """The runtime's ExecResult (bytes output) -> the wire ExecResult (text output)."""
    return ExecResult(
        exit_code=int(result.exit_code),
        stdout=_text(result.stdout),
        stderr=_text(result.stderr),
        duration=round(float(result.duration), 6),
        timed_out=bool(result.timed_out),
        truncated=bool(getattr(result, "truncated", False)),
    )


def _text(data: bytes | str) -> str:
    return data if isinstance(data, str) else data.decode("utf-8", "replace")


def stream(run: RunExec, finish: Callable[[Any], ExecResult], name: str = "exec") -> Iterator[ExecChunk]:
    """Run `run(on_output)` in a thread; yield output chunks, then `finish(result)` as the result."""
    q: queue.Queue[Any] = queue.Queue()
    decoders = {s: codecs.getincrementaldecoder("utf-8")("replace") for s in ("stdout", "stderr")}

    def on_output(stream_name: str, data: bytes) -> None:
        q.put((stream_name, data))

    def worker() -> None:
        try:
            q.put(("result", run(on_output)))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, re-raised there
            q.put(("error", exc))
        finally:
            q.put(_END)

    threading.Thread(target=worker, name=f"rollstack-{name}", daemon=True).start()
    return _drain(q, decoders, finish)


def _drain(q: queue.Queue[Any], decoders: dict[str, Any], finish: Callable[[Any], ExecResult]) -> Iterator[ExecChunk]:
    outcome: tuple[str, Any] | None = None
    while True:
        item = q.get()
        if item is _END:
            break
        kind, payload = item
        if kind in decoders:
            text = decoders[kind].decode(payload)
            if text:
                yield ExecChunk(type=kind, data=text)
        else:
            outcome = (kind, payload)
    for kind, dec in decoders.items():
        tail = dec.decode(b"", final=True)
        if tail:
            yield ExecChunk(type=kind, data=tail)
    assert outcome is not None
    kind, payload = outcome
    if kind == "error":
        raise payload
    yield ExecChunk(type="result", result=finish(payload))
