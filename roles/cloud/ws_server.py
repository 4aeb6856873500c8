"""The hub's websocket server: wsproto driven by the session's own task, with no reader task.

trio-websocket runs a reader task per connection and hands each message over a memory channel,
two task switches a frame, and keeps a nursery, a channel and their events per connection. Here
:meth:`ServerWebSocket.receive` reads the socket itself, feeds wsproto, answers pings and close
frames on the spot and returns the next message. That is enough because a session always has a
task in ``receive()`` (session_handler.py), so a ping is answered as soon as it arrives, and
``heard_at`` counts whatever arrived, pings included.

The opening handshake is wsproto's too (:func:`read_upgrade`); the caller checks the request and
then accepts it or refuses it with an HTTP status and a body.
"""

from __future__ import annotations

import contextlib
import os
from typing import Final, cast, final

import trio
from wsproto import ConnectionType
from wsproto.connection import Connection, ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    Pong,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.handshake import H11Handshake
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from nodetask.link import NORMAL_CLOSE, Frame, LinkClosed
from roles.cloud.wire import Wire

__all__ = ["ABNORMAL_CLOSE", "MESSAGE_TOO_BIG", "ServerWebSocket", "UpgradeRequest", "read_upgrade"]

ABNORMAL_CLOSE: Final = 1006
"""No close frame: the connection ended or broke (never sent, RFC 6455 7.4.1)."""
MESSAGE_TOO_BIG: Final = 1009

_Broken = (OSError, trio.ClosedResourceError)
"""What the socket raises once the connection is gone (ssl.SSLError is an OSError)."""


@final
class UpgradeRequest:
    """An edge's websocket upgrade request, to be accepted or refused once."""

    def __init__(self, wire: Wire, handshake: H11Handshake, request: Request, max_message_bytes: int) -> None:
        self._wire = wire
        self._handshake = handshake
        self._request = request
        self._max_message_bytes = max_message_bytes

    @property
    def path(self) -> str:
        return self._request.target

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        return list(self._request.extra_headers)

    async def accept(self) -> ServerWebSocket:
        """Answer 101 and open the websocket. Errors: :class:`LinkClosed`."""
        try:
            await self._wire.send(self._handshake.send(AcceptConnection()))
        except _Broken:
            raise LinkClosed("the connection broke during the handshake") from None
        connection = self._handshake.connection
        assert connection is not None  # set by the accept just sent
        return ServerWebSocket(self._wire, connection, max_message_bytes=self._max_message_bytes)

    async def reject(self, status: int, body: bytes) -> None:
        """Answer with an HTTP ``status`` and ``body`` (the caller then closes the connection)."""
        head = RejectConnection(
            status_code=status, headers=[(b"content-length", b"%d" % len(body))], has_body=bool(body)
        )
        data = self._handshake.send(head)
        if body:
            data += self._handshake.send(RejectData(data=body))
        with contextlib.suppress(*_Broken):  # an edge that went needs no answer
            await self._wire.send(data)


async def read_upgrade(wire: Wire, *, max_message_bytes: int) -> UpgradeRequest | None:
    """Read an HTTP upgrade request from ``wire``; None if the peer went first or sent no valid one
    (which is then answered with wsproto's status for it, as a websocket server answers)."""
    handshake = H11Handshake(ConnectionType.SERVER)
    while True:
        try:
            data = await wire.receive()
        except _Broken:
            return None
        if not data:
            return None
        try:
            handshake.receive_data(data)
        except RemoteProtocolError as exc:
            if exc.event_hint is not None:
                try:
                    await wire.send(handshake.send(exc.event_hint))
                except (*_Broken, LocalProtocolError):
                    pass
            return None
        for event in handshake.events():
            if isinstance(event, Request):
                return UpgradeRequest(wire, handshake, event, max_message_bytes)


@final
class ServerWebSocket:
    """An accepted websocket, as the session handler's :class:`~nodetask.link.Link`."""

    __slots__ = (
        "_ended",
        "_heard",
        "_inbox",
        "_max_message_bytes",
        "_parts",
        "_pings",
        "_read_done",
        "_size",
        "_wire",
        "_ws",
    )

    def __init__(self, wire: Wire, connection: Connection, *, max_message_bytes: int) -> None:
        self._wire = wire
        self._ws = connection
        self._max_message_bytes = max_message_bytes
        self._inbox: list[Frame] = []
        """Messages read and not yet received: rarely more than one (a list is a tenth of a deque's size)."""
        self._parts: list[str | bytes | bytearray] = []
        self._size = 0
        self._ended: str | None = None
        """Why no more frames come, once that is so (the text of the :class:`LinkClosed` raised)."""
        self._pings: dict[bytes, trio.Event] | None = None
        self._heard = trio.current_time()
        self._read_done: trio.Event | None = None
        """Set when the read under way is done, for a close waiting on it."""

    def heard_at(self) -> float:
        return self._heard

    async def receive(self) -> Frame:
        # Frames that arrived before a close are still delivered, as by trio-websocket.
        while not self._inbox:
            if self._ended is not None:
                raise LinkClosed(self._ended)
            await self._read()
        return self._inbox.pop(0)

    async def send(self, frame: bytes) -> None:
        await self._send(BytesMessage(data=frame))

    async def ping(self) -> None:
        """Ping the edge and wait for its pong, which arrives through :meth:`receive` (the session's reader)."""
        payload = os.urandom(4)
        if self._pings is None:
            self._pings = {}
        answered = self._pings[payload] = trio.Event()
        await self._send(Ping(payload=payload))
        await answered.wait()

    async def close(self, code: int = NORMAL_CLOSE, reason: str = "") -> None:
        """Send a close frame, wait for the edge's (the caller bounds the wait), close the socket; idempotent."""
        try:
            if self._ws.state is ConnectionState.OPEN and not self._wire.broken:
                self._end(f"closed by the hub with {code}")
                await self._wire.send(self._ws.send(CloseConnection(code=code, reason=reason)))
                while self._awaiting_close_reply():
                    if self._wire.reading:  # another task is in receive(): it takes the reply in
                        self._read_done = trio.Event()
                        await self._read_done.wait()
                        continue
                    data = await self._wire.receive()
                    if not data:
                        break
                    self._ws.receive_data(data)
                    for _ in self._ws.events():
                        pass  # a close frame moves the state on; nothing else is wanted now
        except _Broken:
            pass
        finally:
            self._end("closed by the hub")
            self._wire.close()

    async def _send(self, event: BytesMessage | Ping) -> None:
        if self._ended is not None or self._ws.state is not ConnectionState.OPEN:
            raise LinkClosed(self._ended or "the websocket is closing")
        try:
            await self._wire.send(self._ws.send(event))
        except _Broken:
            self._end("the connection broke")
            raise LinkClosed("the connection broke") from None

    async def _read(self) -> None:
        """Read what the socket has, answer its pings and close frame, and queue its messages."""
        try:
            await self._read_some()
        finally:
            if self._read_done is not None:
                self._read_done.set()
                self._read_done = None

    async def _read_some(self) -> None:
        try:
            data = await self._wire.receive()
        except _Broken:
            self._end("the connection broke")
            return
        self._heard = trio.current_time()
        if not data:
            self._end(f"the edge closed the connection without a close frame ({ABNORMAL_CLOSE})")
            return
        self._ws.receive_data(data)
        answer = self._take_events()
        if answer:
            try:
                await self._wire.send(answer)
            except _Broken:
                self._end("the connection broke")

    def _take_events(self) -> bytes:
        """Queue the messages wsproto has parsed; the bytes that answer its pings and close frame."""
        ws = self._ws
        answer = b""
        for event in ws.events():
            if isinstance(event, (TextMessage, BytesMessage)):
                if not self._message_part(event):
                    self._end(f"closed by the hub with {MESSAGE_TOO_BIG}: {self._too_big()}")
                    return answer + ws.send(CloseConnection(code=MESSAGE_TOO_BIG, reason=self._too_big()))
            elif isinstance(event, Ping):
                if ws.state is ConnectionState.OPEN:
                    answer += ws.send(event.response())
            elif isinstance(event, Pong):
                self._ponged(bytes(event.payload))
            elif isinstance(event, CloseConnection):
                if ws.state is ConnectionState.REMOTE_CLOSING:
                    self._end(f"closed by the edge with {event.code}")
                    return answer + ws.send(event.response())
                if ws.state is ConnectionState.OPEN:
                    # A frame wsproto could not parse: it names the close code (1002, 1007, ...).
                    self._end(f"closed by the hub with {event.code}: {event.reason}")
                    return answer + ws.send(CloseConnection(code=event.code, reason=event.reason))
                self._end(f"closed by the hub with {event.code}")  # the edge's answer to our close
                return answer
        return answer

    def _message_part(self, event: TextMessage | BytesMessage) -> bool:
        """Add a part of a message (queued once it is whole); False if the message is too big."""
        self._size += len(event.data)
        if self._size > self._max_message_bytes:
            self._parts.clear()
            self._size = 0
            return False
        if not event.message_finished:
            self._parts.append(event.data)
            return True
        message: Frame
        if isinstance(event, TextMessage):
            message = "".join([*cast("list[str]", self._parts), event.data]) if self._parts else event.data
        else:  # wsproto may hand over a bytearray; a Frame is bytes
            message = b"".join([*cast("list[bytes | bytearray]", self._parts), event.data])
        self._inbox.append(message)
        self._parts.clear()
        self._size = 0
        return True

    def _awaiting_close_reply(self) -> bool:
        return self._ws.state is ConnectionState.LOCAL_CLOSING

    def _too_big(self) -> str:
        return f"Exceeded maximum message size: {self._max_message_bytes} bytes"

    def _ponged(self, payload: bytes) -> None:
        # A pong answers its ping and any sent before it (an edge may answer only the last).
        if self._pings is None or payload not in self._pings:
            return
        while self._pings:
            sent, answered = next(iter(self._pings.items()))
            del self._pings[sent]
            answered.set()
            if sent == payload:
                return

    def _end(self, why: str) -> None:
        if self._ended is None:
            self._ended = why
