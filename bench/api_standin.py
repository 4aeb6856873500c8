"""What stands in for the API server behind a hub's relay: ``python -m bench.api_standin --upstream HOST:PORT``.

The relay connects devices' tunnels to the API server in the hub's kubeconfig, so the hub's own
API traffic and its tunnels reach the same address. This process listens there: a connection that
opens with a TLS record (the hub's own client) is passed through to the real API server; any other
is a simulated kubelet connection (:mod:`bench.tunnel_fleet`), whose bytes open with a header
``b"R"|b"W"`` + request size + answer size (big-endian 32-bit each): a request connection (``R``) is
answered, for every whole request, with that many bytes; a watch (``W``) is answered once, then sent
that many bytes every ``--bookmark-s`` seconds (a bookmark), from a random phase. It prints its port.
"""

from __future__ import annotations

import argparse
import json
import random
import struct
import sys
from typing import Final

import trio

from bench.fleet import raise_fd_limit

HEADER: Final = struct.Struct(">cII")
TLS_HANDSHAKE: Final = 0x16


def request(kind: bytes, size: int, answer: int) -> bytes:
    """A simulated request of ``size`` bytes (at least the header) asking for ``answer`` bytes."""
    head = HEADER.pack(kind, size, answer)
    return head + b"x" * max(0, size - len(head))


async def _pump(source: trio.SocketStream, sink: trio.SocketStream) -> None:
    try:
        while data := await source.receive_some(65536):
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def _passthrough(client: trio.SocketStream, first: bytes, host: str, port: int) -> None:
    async with await trio.open_tcp_stream(host, port) as upstream:
        await upstream.send_all(first)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pump, upstream, client)
            await _pump(client, upstream)
            nursery.cancel_scope.cancel()


async def _simulated(client: trio.SocketStream, buffer: bytearray, bookmark_s: float) -> None:
    while True:
        while len(buffer) < HEADER.size:
            data = await client.receive_some(65536)
            if not data:
                return
            buffer += data
        kind, size, answer = HEADER.unpack_from(buffer)
        while len(buffer) < size:
            data = await client.receive_some(65536)
            if not data:
                return
            buffer += data
        del buffer[:size]
        await client.send_all(b"a" * answer)
        if kind == b"W":
            await trio.sleep(random.uniform(0, bookmark_s))
            while True:
                await client.send_all(b"b" * answer)
                await trio.sleep(bookmark_s)


async def serve(args: argparse.Namespace) -> None:
    host, _, port = args.upstream.rpartition(":")

    async def handle(client: trio.SocketStream) -> None:
        try:
            first = await client.receive_some(65536)
            if not first:
                return
            if first[0] == TLS_HANDSHAKE:
                await _passthrough(client, first, host, int(port))
            else:
                await _simulated(client, bytearray(first), args.bookmark_s)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await client.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1", backlog=4096)
    sys.stdout.write(json.dumps({"event": "listening", "port": listeners[0].socket.getsockname()[1]}) + "\n")
    sys.stdout.flush()
    await trio.serve_listeners(handle, listeners)


def main() -> None:
    p = argparse.ArgumentParser(prog="bench.api_standin", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--upstream", required=True, help="the real API server's HOST:PORT, for TLS connections")
    p.add_argument("--bookmark-s", type=float, default=60.0, help="seconds between a watch's bookmarks")
    args = p.parse_args()
    raise_fd_limit()
    trio.run(serve, args)


if __name__ == "__main__":
    main()
