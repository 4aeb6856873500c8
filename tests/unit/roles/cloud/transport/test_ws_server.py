"""The hub's websocket over a real socket pair, with wsproto's frame layer as the edge."""

from __future__ import annotations

import socket
import tracemalloc

import trio
import trio.testing
from wsproto.frame_protocol import FrameProtocol

from roles.cloud.transport.wire import Wire
from roles.cloud.transport.ws_server import ServerWebSocket


async def test_pings_sent_while_the_hub_waits_for_a_close_answer_are_not_kept() -> None:
    """An edge flooding pings instead of answering the hub's close costs the hub no memory per ping."""
    ours, theirs = socket.socketpair()
    ws = ServerWebSocket(Wire(ours), max_message_bytes=1 << 20)
    edge = trio.socket.from_stdlib_socket(theirs)
    client = FrameProtocol(client=True, extensions=[])
    pings = client.ping(b"ping") * 2000
    tracemalloc.start()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ws.close, 4008, "no heartbeat")
            assert (await edge.recv(64))[:4] == b"\x88\x0e\x0f\xa8"  # the hub's close, 4008
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(10):
                await edge.send(pings)
            await trio.testing.wait_all_tasks_blocked()
            held = tracemalloc.get_traced_memory()[0] - before
            await edge.send(client.close(4008))
    finally:
        tracemalloc.stop()
    assert held < 64 * 1024
    edge.close()
