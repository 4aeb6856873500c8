"""The hub's websocket layer over real sockets: pings, fragments, the size limit, close handshakes, a stalled edge.

The layer has no reader task: what arrives is read by the task in ``receive()``, which a session
always has. These tests hold it to what trio-websocket did for the hub, with trio-websocket (the
edge's library) or wsproto itself as the client.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
import trio
import trio_websocket
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, BytesMessage, CloseConnection, Request, TextMessage

from nodetask import messages
from nodetask.link import Frame, LinkClosed
from nodetask.messages import Hello, Welcome
from roles.cloud.transport.wire import Wire
from roles.cloud.transport.ws_server import ServerWebSocket, read_upgrade
from roles.common.tls import generate_serving_certificate
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import register_edges
from tests.integration.hubs import running_hub
from tests.integration.objects import unique

pytestmark = pytest.mark.integration
LOOPBACK = "127.0.0.1"

Session = Callable[[ServerWebSocket], Awaitable[None]]


@asynccontextmanager
async def serving(
    session: Session, *, tls: ssl.SSLContext | None = None, max_message_bytes: int = 1 << 20
) -> AsyncIterator[int]:
    """Serve websockets on loopback, each accepted one handed to ``session``; yields the port."""

    async def connection(stream: trio.SocketStream) -> None:
        wire = Wire.take(stream)
        try:
            if tls is not None:
                await wire.start_tls(tls)
            request = await read_upgrade(wire, max_message_bytes=max_message_bytes)
            assert request is not None
            await session(await request.accept())
        finally:
            wire.close()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, connection, 0, host=LOOPBACK))
        yield listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel()


async def read_all(ws: ServerWebSocket, into: list[Frame]) -> str:
    """Receive until the link closes; the LinkClosed text."""
    while True:
        try:
            into.append(await ws.receive())
        except LinkClosed as exc:
            return str(exc)


@pytest.fixture(params=["ws", "wss"])
def tls_pair(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    """Server and client TLS contexts (both None for plain ws://)."""
    if request.param == "ws":
        return None, None
    cert = generate_serving_certificate(tmp_path / "tls", dns_names=["localhost"])
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert.cert_file, cert.key_file)
    return server, ssl.create_default_context(cadata=cert.ca_bundle.decode())


async def test_pings_are_answered_and_heard_while_the_session_waits_in_receive(
    tls_pair: tuple[ssl.SSLContext | None, ssl.SSLContext | None],
) -> None:
    """An edge's pings get pongs and move heard_at with no frame for the session; its messages come through intact."""
    server_tls, client_tls = tls_pair
    heard: list[float] = []
    received: list[Frame] = []
    pinged, ended = trio.Event(), trio.Event()

    async def session(ws: ServerWebSocket) -> None:
        heard.append(ws.heard_at())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all, ws, received)
            await pinged.wait()
            heard.append(ws.heard_at())
        ended.set()

    async with serving(session, tls=server_tls) as port:
        async with trio_websocket.open_websocket(LOOPBACK, port, "/nodes/n", use_ssl=client_tls or False) as ws:
            for _ in range(50):
                await ws.ping()
            pinged.set()
            assert received == []
            await ws.send_message(b"bytes")
            await ws.send_message("text")
        await ended.wait()
    assert heard[1] > heard[0]
    assert received == [b"bytes", "text"]
    assert [type(frame) for frame in received] == [bytes, str]


async def test_the_hubs_ping_is_answered_through_the_sessions_receive() -> None:
    """A ping from the hub returns once the edge's pong is read by the task in receive()."""
    pinged = trio.Event()

    async def session(ws: ServerWebSocket) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all, ws, [])
            await ws.ping()
            pinged.set()
            await ws.close()

    async with (
        serving(session) as port,
        trio_websocket.open_websocket(LOOPBACK, port, "/nodes/n", use_ssl=False) as ws,
    ):
        with pytest.raises(trio_websocket.ConnectionClosed):
            await ws.get_message()  # trio-websocket's reader answers the ping meanwhile
    assert pinged.is_set()


async def _raw_client(port: int) -> tuple[trio.SocketStream, WSConnection]:
    """A wsproto client over a plain TCP stream, past its opening handshake."""
    stream = await trio.open_tcp_stream(LOOPBACK, port)
    client = WSConnection(ConnectionType.CLIENT)
    await stream.send_all(client.send(Request(host="localhost", target="/nodes/n")))
    while True:
        client.receive_data(await stream.receive_some())
        if any(isinstance(event, AcceptConnection) for event in client.events()):
            return stream, client


async def test_fragmented_messages_arrive_whole() -> None:
    """A text and a binary message each sent in three fragments are received as one message each."""
    received: list[Frame] = []
    ended = trio.Event()

    async def session(ws: ServerWebSocket) -> None:
        await read_all(ws, received)
        ended.set()

    async with serving(session) as port:
        stream, client = await _raw_client(port)
        async with stream:
            data = b""
            for part in ("he", "ll", "o"):
                data += client.send(TextMessage(data=part, message_finished=part == "o"))
            for chunk in (b"\x00", b"\x01", b"\xff"):
                data += client.send(BytesMessage(data=chunk, message_finished=chunk == b"\xff"))
            for byte in range(len(data)):  # one byte a write: frames split anywhere
                await stream.send_all(data[byte : byte + 1])
            await stream.send_all(client.send(CloseConnection(code=1000)))
            await ended.wait()
    assert received == ["hello", b"\x00\x01\xff"]
    assert isinstance(received[1], bytes)


async def test_a_message_over_the_limit_closes_the_websocket_with_1009() -> None:
    """A message past max_message_bytes, even in fragments, closes with 1009 and ends the session's receive."""
    ends: list[str] = []

    async def session(ws: ServerWebSocket) -> None:
        ends.append(await read_all(ws, []))
        await ws.close()

    async def send_too_much(ws: trio_websocket.WebSocketConnection) -> None:
        # The hub may close while the message is still going out, or after.
        await ws.send_message("y" * 1001)
        await ws.get_message()

    async with (
        serving(session, max_message_bytes=1000) as port,
        trio_websocket.open_websocket(LOOPBACK, port, "/nodes/n", use_ssl=False) as ws,
    ):
        await ws.send_message("x" * 1000)  # at the limit: taken
        with pytest.raises(trio_websocket.ConnectionClosed) as closed:
            await send_too_much(ws)
    assert closed.value.reason is not None
    assert closed.value.reason.code == 1009
    assert ends == ["closed by the hub with 1009: Exceeded maximum message size: 1000 bytes"]


async def test_close_handshakes_either_way_carry_the_code() -> None:
    """The hub's close reaches the edge with its code and reason; an edge's close ends the session's receive."""
    ends: list[str] = []
    edge_closed = trio.Event()

    async def session(ws: ServerWebSocket) -> None:
        frame = await ws.receive()
        if frame == "close me":
            await ws.close(4008, "no heartbeat")
        else:
            ends.append(await read_all(ws, []))
            edge_closed.set()

    async with serving(session) as port:
        async with trio_websocket.open_websocket(LOOPBACK, port, "/nodes/n", use_ssl=False) as ws:
            await ws.send_message("close me")
            with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                await ws.get_message()
        async with trio_websocket.open_websocket(LOOPBACK, port, "/nodes/n", use_ssl=False) as ws:
            await ws.send_message("stay")
            await ws.aclose(1001, "going")
        await edge_closed.wait()
    assert closed.value.reason is not None
    assert (closed.value.reason.code, closed.value.reason.reason) == (4008, "no heartbeat")
    assert ends == ["closed by the edge with 1001"]


async def test_an_edge_that_stops_mid_frame_is_closed_at_its_heartbeat_deadline(crds: ControlPlane) -> None:
    """An edge that sends half a frame after its Hello and then nothing is closed with 4008, and only once."""
    node = unique("stall")
    tokens = await register_edges(crds, [node])
    async with running_hub(crds, "hub-stall", heartbeat=0.3) as hub:
        port = int(hub.url.rsplit(":", 1)[1])
        stream = await trio.open_tcp_stream(LOOPBACK, port)
        client = WSConnection(ConnectionType.CLIENT)
        headers = [(b"authorization", f"Bearer {tokens[node]}".encode())]
        async with stream:
            await stream.send_all(client.send(Request(host="hub", target=f"/nodes/{node}", extra_headers=headers)))
            events: list[object] = []
            sent_hello = False
            closes: list[CloseConnection] = []
            with anyio.fail_after(20):
                while not closes:
                    data = await stream.receive_some()
                    assert data, "the hub closed the connection without a close frame"
                    client.receive_data(data)
                    for event in client.events():
                        events.append(event)
                        if isinstance(event, CloseConnection):
                            closes.append(event)
                    if not sent_hello and any(isinstance(e, AcceptConnection) for e in events):
                        hello = client.send(BytesMessage(data=messages.encode(Hello(node=node, version="v1"))))
                        frame = client.send(TextMessage(data='{"op":"heartbeat","sentAt":1.0}'))
                        await stream.send_all(hello + frame[: len(frame) // 2])  # and never the rest
                        sent_hello = True
    welcomes = [e for e in events if isinstance(e, BytesMessage)]
    assert [type(messages.decode_downstream(bytes(e.data))) for e in welcomes] == [Welcome]
    assert [c.code for c in closes] == [4008]


async def test_an_edge_that_never_says_hello_nor_answers_the_close_is_let_go(crds: ControlPlane) -> None:
    """The hub's close for a missing Hello waits for the edge's answer only for its close grace, then drops it."""
    node = unique("mute")
    tokens = await register_edges(crds, [node])
    async with running_hub(crds, "hub-mute", hello_timeout=0.3, close_grace=0.3) as hub:
        port = int(hub.url.rsplit(":", 1)[1])
        stream = await trio.open_tcp_stream(LOOPBACK, port)
        client = WSConnection(ConnectionType.CLIENT)
        headers = [(b"authorization", f"Bearer {tokens[node]}".encode())]
        closes: list[CloseConnection] = []
        async with stream:
            await stream.send_all(client.send(Request(host="hub", target=f"/nodes/{node}", extra_headers=headers)))
            with anyio.fail_after(20):
                while data := await stream.receive_some():  # never answering the close
                    client.receive_data(data)
                    closes += [e for e in client.events() if isinstance(e, CloseConnection)]
    assert [(c.code, c.reason) for c in closes] == [(1002, "no hello")]
