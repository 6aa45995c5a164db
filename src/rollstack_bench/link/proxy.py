"""A TCP proxy that adds a fixed one-way delay in each direction (round-trip delay = 2 x delay).

This kernel has no `netem` qdisc, so the benchmark link gets its latency here. Delay is
pipelined, not serialising: each chunk read at time t is written at t + delay, so a stream keeps
its throughput (the rate itself is shaped by `tc` on the veth behind the proxy). Runs as its own
process (`python -m rollstack_bench.link.proxy LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT
DELAY_S`) so the benchmark process's GIL never stalls the link; prints `ready PORT` once
listening.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time

CHUNK = 256 * 1024


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(maxsize=32)  # backpressure on uploads

    async def read_side() -> None:
        while True:
            data = await reader.read(CHUNK)
            await queue.put((time.monotonic() + delay, data))
            if not data:
                return

    async def write_side() -> None:
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    tasks = [asyncio.ensure_future(read_side()), asyncio.ensure_future(write_side())]
    try:
        await asyncio.gather(*tasks)
    except (ConnectionError, OSError):
        pass
    finally:
        for t in tasks:
            t.cancel()


async def _handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter, target: tuple[str, int], delay: float) -> None:
    try:
        # The handshake to the target costs one more round trip, as a real connection would.
        await asyncio.sleep(2 * delay)
        ur, uw = await asyncio.open_connection(*target)
    except OSError:
        cw.close()
        return
    for w in (cw, uw):
        sock = w.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        await asyncio.gather(_pump(cr, uw, delay), _pump(ur, cw, delay))
    finally:
        for w in (cw, uw):
            w.close()


async def serve(listen: tuple[str, int], target: tuple[str, int], delay: float) -> None:
    server = await asyncio.start_server(lambda r, w: _handle(r, w, target, delay), *listen, backlog=512)
    port = server.sockets[0].getsockname()[1]
    print(f"ready {port}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    if len(argv) != 5:
        print("usage: netem_proxy LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT DELAY_S", file=sys.stderr)
        return 2
    lh, lp, th, tp, d = argv
    try:
        asyncio.run(serve((lh, int(lp)), (th, int(tp)), float(d)))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
