"""The hub's websocket server: driven by the session's own task, with no reader task.

trio-websocket runs a reader task per connection and hands each message over a memory channel,
two task switches a frame, and keeps a nursery, a channel and their events per connection. Here
:meth:`ServerWebSocket.receive` reads the socket itself, parses its frames
(:mod:`~roles.cloud.transport.ws_frames`), answers pings and close
frames on the spot and returns the next message. That is enough because a session always has a
task in ``receive()`` (session_handler.py), so a ping is answered as soon as it arrives, and
``heard_at`` counts whatever arrived, pings included.

The opening handshake is wsproto's (:func:`read_upgrade`); the caller checks the request and
then accepts it or refuses it with an HTTP status and a body.
"""

from __future__ import annotations

import contextlib
import os
from typing import Final, final

import trio
from wsproto import ConnectionType
from wsproto.events import AcceptConnection, RejectConnection, RejectData, Request
from wsproto.handshake import H11Handshake
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from nodetask.link import NORMAL_CLOSE, Frame, LinkClosed
from roles.cloud.transport.wire import Wire
from roles.cloud.transport.ws_frames import (
    FrameReader,
    ProtocolFailure,
    close_frame,
    data_frame,
    ping_frame,
    pong_frame,
)

__all__ = ["ABNORMAL_CLOSE", "ServerWebSocket", "UpgradeRequest", "read_upgrade"]

ABNORMAL_CLOSE: Final = 1006
"""No close frame: the connection ended or broke (never sent, RFC 6455 7.4.1)."""

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
        return ServerWebSocket(self._wire, max_message_bytes=self._max_message_bytes)

    async def reject(self, status: int, body: bytes) -> None:
        """Answer with an HTTP ``status`` and ``body`` (the caller then closes the connection)."""
        # wsproto adds "content-length: 0" itself when there is no body.
        length = [(b"content-length", b"%d" % len(body))] if body else []
        head = RejectConnection(status_code=status, headers=length, has_body=bool(body))
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
        "_close_received",
        "_close_sent",
        "_ended",
        "_heard",
        "_inbox",
        "_pings",
        "_read_done",
        "_reader",
        "_wire",
    )

    def __init__(self, wire: Wire, *, max_message_bytes: int) -> None:
        self._wire = wire
        self._reader = FrameReader(max_message_bytes)
        self._inbox: list[Frame] = []
        """Messages read and not yet received: rarely more than one (a list is a tenth of a deque's size)."""
        self._close_sent = False
        self._close_received = False
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
        await self._send(data_frame(frame))

    async def ping(self) -> None:
        """Ping the edge and wait for its pong, which arrives through :meth:`receive` (the session's reader)."""
        payload = os.urandom(4)
        if self._pings is None:
            self._pings = {}
        answered = self._pings[payload] = trio.Event()
        await self._send(ping_frame(payload))
        await answered.wait()

    async def close(self, code: int = NORMAL_CLOSE, reason: str = "") -> None:
        """Send a close frame, wait for the edge's (the caller bounds the wait), close the socket; idempotent."""
        try:
            if not self._close_sent and not self._wire.broken:
                self._end(f"closed by the hub with {code}")
                self._close_sent = True
                await self._wire.send(close_frame(code, reason))
                while not self._close_received:
                    if self._wire.reading:  # another task is in receive(): it takes the reply in
                        self._read_done = trio.Event()
                        await self._read_done.wait()
                        continue
                    data = await self._wire.receive()
                    if not data:
                        break
                    self._reader.feed(data)  # messages after the hub's close are not wanted
                    # Nor are its pings and pongs, which would otherwise pile up for as long as the edge sends them.
                    self._reader.pings.clear()
                    self._reader.pongs.clear()
                    self._close_received = self._reader.closed_with is not None
        except (*_Broken, ProtocolFailure):
            pass
        finally:
            self._end("closed by the hub")
            self._wire.close()

    async def _send(self, frame: bytes) -> None:
        if self._ended is not None or self._close_sent:
            raise LinkClosed(self._ended or "the websocket is closing")
        try:
            await self._wire.send(frame)
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
        answer = self._take(data)
        if answer:
            try:
                await self._wire.send(answer)
            except _Broken:
                self._end("the connection broke")

    def _take(self, data: bytes) -> bytes:
        """Queue the messages ``data`` completes; the bytes that answer its pings and close frame."""
        reader = self._reader
        try:
            self._inbox += reader.feed(data)
        except ProtocolFailure as failure:
            self._end(f"closed by the hub with {failure.code}: {failure.reason}")
            if self._close_sent:
                return b""
            self._close_sent = True
            return close_frame(failure.code, failure.reason)
        answer = b""
        if reader.pings:
            if not self._close_sent:
                answer = b"".join(map(pong_frame, reader.pings))
            reader.pings.clear()
        if reader.pongs:
            for payload in reader.pongs:
                self._ponged(payload)
            reader.pongs.clear()
        if reader.closed_with is not None and not self._close_received:
            self._close_received = True
            code = reader.closed_with[0]
            if self._close_sent:
                self._end(f"closed by the hub with {code}")  # the edge's answer to the hub's close
            else:
                self._end(f"closed by the edge with {code}")
                self._close_sent = True
                answer += close_frame(code)
        return answer

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
