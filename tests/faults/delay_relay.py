#!/usr/bin/env python3
# tests/faults/delay_relay.py LISTEN_HOST:PORT TARGET_HOST:PORT CONTROL: a TCP relay that
# holds every chunk of bytes, in each direction, for the number of milliseconds the file
# CONTROL holds (0 when it is missing or empty; read every 50 ms), keeping their order. The
# fault suite's `partition` case puts it on the wallet's link for added latency, because this
# kernel has no `tc netem` (CONFIG_NET_SCH_NETEM is not set); where it has, netem does the same
# on the interface. Half the delay is spent on each direction, so a request and its answer
# take CONTROL milliseconds more, as `netem delay` on one side's egress would add.

import asyncio
import sys
import time

DELAY = 0.0


async def watch(control):
    global DELAY
    while True:
        try:
            with open(control) as f:
                text = f.read().strip()
            DELAY = float(text or 0) / 1000.0
        except (OSError, ValueError):
            DELAY = 0.0
        await asyncio.sleep(0.05)


async def pipe(reader, writer):
    # Each chunk is due half the delay after it was read; a queue keeps them in order.
    queue = asyncio.Queue()

    async def send():
        while True:
            due, data = await queue.get()
            if data is None:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    sender = asyncio.ensure_future(send())
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            await queue.put((time.monotonic() + DELAY / 2, data))
    except (ConnectionError, OSError):
        pass
    await queue.put((0, None))
    try:
        await sender
        writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def serve(target_host, target_port, client_reader, client_writer):
    try:
        up_reader, up_writer = await asyncio.open_connection(target_host, target_port)
    except OSError:
        client_writer.close()
        return
    await asyncio.gather(pipe(client_reader, up_writer), pipe(up_reader, client_writer))
    for w in (client_writer, up_writer):
        w.close()


async def main():
    listen, target, control = sys.argv[1:4]
    host, port = listen.rsplit(":", 1)
    target_host, target_port = target.rsplit(":", 1)
    asyncio.ensure_future(watch(control))
    server = await asyncio.start_server(
        lambda r, w: serve(target_host, int(target_port), r, w), host, int(port)
    )
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
