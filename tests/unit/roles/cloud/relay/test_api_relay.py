"""A hub relays an edge's tunnels to the API server's address: bytes both ways, refusals with reasons, stalls alone."""

from __future__ import annotations

import errno
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import pytest

from nodetask import messages
from nodetask.messages import (
    TUNNEL_CAPABILITY,
    Error,
    Heartbeat,
    TunnelClose,
    TunnelCredit,
    TunnelOpen,
    TunnelOpened,
)
from nodetask.tunnel import WINDOW, data_frame, is_data, read_data
from tests.unit.roles.cloud.doubles import FakeEdge, MemoryApi, edge_nodes, running_hub
from tools.ports import held

NODE = "edge-1"


@asynccontextmanager
async def echo_server() -> AsyncIterator[tuple[int, list[bytes]]]:
    """A TCP server on loopback that echoes what it receives (recorded, then ``b"<closed>"`` when a client goes)."""
    received: list[bytes] = []

    async def serve(client: anyio.abc.SocketStream) -> None:
        async with client:
            try:
                while True:
                    data = await client.receive()
                    received.append(data)
                    await client.send(data)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                received.append(b"<closed>")

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        yield listener.extra(anyio.abc.SocketAttribute.local_port), received
        tg.cancel_scope.cancel()


async def _next_frame(edge: FakeEdge) -> bytes | object:
    """The next frame: a tunnel's bytes raw, anything else decoded (heartbeat echoes skipped)."""
    while True:
        frame = await edge.link.receive()
        if is_data(frame):
            return frame
        msg = edge_decode(frame)
        if not isinstance(msg, Heartbeat):
            return msg


async def _heartbeat_echo(edge: FakeEdge) -> None:
    """Read frames until the hub's heartbeat echo."""
    while True:
        frame = await edge.link.receive()
        if not is_data(frame) and isinstance(edge_decode(frame), Heartbeat):
            return


def edge_decode(frame: bytes | str) -> object:
    return messages.decode_downstream(frame)


async def test_a_tunnel_carries_bytes_to_the_api_server_and_back() -> None:
    """The hub connects a tunnel to its API server's address and relays bytes both ways; closing ends it."""
    api = MemoryApi()
    edge_nodes(api, NODE)
    async with echo_server() as (port, received), running_hub(api, api_relay=("127.0.0.1", port)) as (_, door):
        edge = door.connect(NODE)
        welcome = await edge.hello(capabilities=(TUNNEL_CAPABILITY,))
        assert TUNNEL_CAPABILITY in welcome.capabilities
        await edge.send(TunnelOpen(stream=7))
        assert await _next_frame(edge) == TunnelOpened(stream=7)
        await edge.link.send(data_frame(7, b"GET /version"))
        frame = await _next_frame(edge)
        assert isinstance(frame, bytes)
        assert read_data(frame) == (7, b"GET /version")
        assert received == [b"GET /version"]
        await edge.send(TunnelClose(stream=7))
        with anyio.fail_after(5):
            while received[-1:] != [b"<closed>"]:  # noqa: ASYNC110 - another task's list, no event to wait on
                await anyio.sleep(0.01)


async def test_an_unreachable_api_server_closes_the_tunnel_with_the_reason() -> None:
    """A tunnel the hub cannot connect is closed with a reason naming the API server."""
    api = MemoryApi()
    edge_nodes(api, NODE)
    with held() as port:
        async with running_hub(api, api_relay=("127.0.0.1", port)) as (_, door):
            edge = door.connect(NODE)
            await edge.hello(capabilities=(TUNNEL_CAPABILITY,))
            await edge.send(TunnelOpen(stream=1))
            closed = await _next_frame(edge)
            assert isinstance(closed, TunnelClose)
            assert closed.stream == 1
            assert "cannot reach the API server" in closed.reason


async def test_tunnels_past_the_limit_are_refused_naming_the_setting() -> None:
    """A node holding its limit of tunnels is refused one more, with the setting's name."""
    api = MemoryApi()
    edge_nodes(api, NODE)
    async with (
        echo_server() as (port, _),
        running_hub(api, api_relay=("127.0.0.1", port), max_tunnels_per_node=2) as (_, door),
    ):
        edge = door.connect(NODE)
        await edge.hello(capabilities=(TUNNEL_CAPABILITY,))
        for number in (1, 2):
            await edge.send(TunnelOpen(stream=number))
            assert await _next_frame(edge) == TunnelOpened(stream=number)
        await edge.send(TunnelOpen(stream=3))
        refused = await _next_frame(edge)
        assert isinstance(refused, TunnelClose)
        assert "apiRelay.maxTunnelsPerNode" in refused.reason


async def test_a_hub_that_does_not_relay_refuses_tunnels_and_does_not_offer_them() -> None:
    """Without apiRelay the Welcome lists no tunnels, and a tunnel asked for anyway is an Error."""
    api = MemoryApi()
    edge_nodes(api, NODE)
    async with running_hub(api) as (_, door):
        edge = door.connect(NODE)
        welcome = await edge.hello(capabilities=(TUNNEL_CAPABILITY,))
        assert TUNNEL_CAPABILITY not in welcome.capabilities
        await edge.send(TunnelOpen(stream=1))
        error = await _next_frame(edge)
        assert isinstance(error, Error)
        assert "apiRelay.enabled" in error.message


async def test_a_tunnel_whose_edge_reads_nothing_does_not_hold_up_the_session() -> None:
    """With a tunnel's window full of bytes the edge has not read, heartbeats are still echoed at once."""
    api = MemoryApi()
    edge_nodes(api, NODE)
    async with echo_server() as (port, _), running_hub(api, api_relay=("127.0.0.1", port)) as (_, door):
        edge = door.connect(NODE)
        await edge.hello(capabilities=(TUNNEL_CAPABILITY,))
        await edge.send(TunnelOpen(stream=1))
        assert await _next_frame(edge) == TunnelOpened(stream=1)
        # Send two windows' worth (granting credit as the hub reads), never reading the echo back.
        sent = 0
        chunk = b"z" * 16384
        while sent < 2 * WINDOW:
            await edge.link.send(data_frame(1, chunk))
            sent += len(chunk)
            if sent % (WINDOW // 2) == 0:
                await anyio.sleep(0.05)
        echoed = 0
        with anyio.move_on_after(2):
            while True:
                frame = await edge.link.receive()
                if is_data(frame):
                    echoed += len(read_data(frame)[1])
                elif isinstance(edge_decode(frame), TunnelCredit):
                    continue
        assert echoed == WINDOW  # the hub stopped at the window: the rest waits for credit
        await edge.send(Heartbeat(sent_at=1.0))
        with anyio.fail_after(5):
            await _heartbeat_echo(edge)


async def test_a_hub_out_of_file_descriptors_says_so_instead_of_blaming_the_api_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tunnel the hub cannot connect for want of descriptors is closed naming the hub's limit."""

    async def no_descriptors(*_: object, **__: object) -> None:
        raise OSError("All connection attempts failed") from OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(anyio, "connect_tcp", no_descriptors)
    api = MemoryApi()
    edge_nodes(api, NODE)
    async with running_hub(api, api_relay=("127.0.0.1", 1)) as (hub, door):
        edge = door.connect(NODE)
        await edge.hello(capabilities=(TUNNEL_CAPABILITY,))
        await edge.send(TunnelOpen(stream=1))
        closed = await _next_frame(edge)
        assert isinstance(closed, TunnelClose)
        assert "no file descriptor left" in closed.reason
        assert hub.metrics.tunnels_opened.labels(outcome="hub_full")._value.get() == 1
