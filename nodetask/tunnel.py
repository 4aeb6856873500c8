"""Byte streams carried inside a session: the device's TLS connections to the API server, relayed by a hub.

A device that runs a kubelet reaches the API server only through its hub session (it opens no other
connection), and speaks TLS end to end inside it, with its node's own client certificate: the hub
relays bytes it cannot read. This module is the multiplexing both ends share (:class:`Tunnels`, one per
session end) and the byte stream each tunnel is to its user (:class:`TunnelStream`, an anyio
``ByteStream``, so TLS and HTTP run over it as over a socket).

The edge opens a tunnel with :class:`~nodetask.messages.TunnelOpen`; the hub connects it to the API
server and answers :class:`~nodetask.messages.TunnelOpened`, or :class:`~nodetask.messages.TunnelClose`
with the reason it could not. Bytes travel in binary frames of their own (:func:`data_frame`): a zero
byte, the tunnel's number in four bytes, then at most :data:`MAX_PAYLOAD` bytes. No JSON message starts
with a zero byte, so the two kinds of frame never mix up, and a tunnel's bytes cost no encoding.

Flow control is per tunnel and per direction, so that one tunnel whose reader stalls never holds up
the session's other traffic (job messages, reports, other tunnels): a sender may have at most
``window`` bytes unread by the other end, and the reader gives credit back
(:class:`~nodetask.messages.TunnelCredit`) as its user consumes them. Bytes beyond the window are a
protocol error that closes that tunnel. A sender that waits ``stall_s`` for credit has a reader that
stopped reading: its tunnel is cut, with a reason saying so, and nothing else is.

A tunnel closes as a whole (TLS and HTTP/1.1 need no half-close): either end's ``aclose`` tells the
other with :class:`~nodetask.messages.TunnelClose`, whose reader sees the end of the stream once it has
read what came before; a close with a reason is a break (``BrokenResourceError`` naming it). When the
session ends, :meth:`Tunnels.end` breaks every tunnel of it.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Awaitable, Callable
from typing import Final, TypeGuard, final

import anyio
import anyio.abc

from nodetask.link import Frame, LinkClosed
from nodetask.messages import MessageError, TunnelClose, TunnelCredit

__all__ = [
    "HEADER_BYTES",
    "MAX_PAYLOAD",
    "STALL_S",
    "WINDOW",
    "SendFrame",
    "SendMessage",
    "TunnelStream",
    "Tunnels",
    "data_frame",
    "is_data",
    "read_data",
]

MAX_PAYLOAD: Final = 16 * 1024
"""Bytes in one data frame: a TLS record's worth, so one tunnel's frame never holds a session up for long."""
WINDOW: Final = 256 * 1024
"""Bytes a sender may have unread by the other end of a tunnel."""
STALL_S: Final = 30.0
"""Seconds a sender waits for credit before it takes the other end to have stopped reading."""
DATA_MARK: Final = 0
_HEADER: Final = struct.Struct(">BI")
HEADER_BYTES: Final = _HEADER.size
"""A data frame's bytes before its payload."""

SendFrame = Callable[[bytes], Awaitable[None]]
"""Puts an encoded frame on the session (its one writer's queue). Errors: :class:`LinkClosed`."""
SendMessage = Callable[[TunnelClose | TunnelCredit], Awaitable[None]]
"""Sends a tunnel message on the session. Errors: :class:`LinkClosed`."""


def data_frame(stream: int, payload: bytes) -> bytes:
    """The frame carrying ``payload`` (at most :data:`MAX_PAYLOAD` bytes) on tunnel ``stream``."""
    return _HEADER.pack(DATA_MARK, stream) + payload


def is_data(frame: Frame) -> TypeGuard[bytes]:
    """Whether ``frame`` is a tunnel's bytes rather than a message."""
    return isinstance(frame, bytes) and frame[:1] == b"\x00"


def read_data(frame: bytes) -> tuple[int, bytes]:
    """The tunnel number and bytes of a data frame. Errors: :class:`MessageError` for a frame too short
    or carrying more than :data:`MAX_PAYLOAD` bytes."""
    if len(frame) < _HEADER.size:
        raise MessageError(f"a tunnel data frame of {len(frame)} bytes has no room for its header")
    if len(frame) - _HEADER.size > MAX_PAYLOAD:
        raise MessageError(f"a tunnel data frame carries {len(frame) - _HEADER.size} bytes; at most {MAX_PAYLOAD}")
    _, stream = _HEADER.unpack_from(frame)
    return stream, bytes(frame[_HEADER.size :])


@final
class TunnelStream(anyio.abc.ByteStream):
    """One tunnel, as a byte stream. Made by :meth:`Tunnels.add`."""

    def __init__(self, number: int, tunnels: Tunnels) -> None:
        self.number = number
        self._tunnels = tunnels
        self._buffer = bytearray()
        self._unthanked = 0
        """Bytes consumed and not yet given back as credit."""
        self._credit = tunnels.window
        self._readable = anyio.Event()
        self._writable = anyio.Event()
        self._eof = False
        self._broken = ""
        self._closed = False

    @property
    def problem(self) -> str:
        """Why the tunnel broke, or ``""``."""
        return self._broken

    @property
    def buffered(self) -> int:
        """Bytes received and not yet read."""
        return len(self._buffer)

    async def send(self, item: bytes) -> None:
        view = memoryview(item)
        while view:
            self._check_open()
            if self._credit <= 0:
                await self._wait_credit()
                continue
            size = min(len(view), self._credit, MAX_PAYLOAD)
            self._credit -= size
            try:
                await self._tunnels.send_frame(data_frame(self.number, bytes(view[:size])))
            except LinkClosed as exc:
                self.broken(str(exc) or "the session ended")
                raise anyio.BrokenResourceError(self._broken) from None
            view = view[size:]

    async def _wait_credit(self) -> None:
        with anyio.move_on_after(self._tunnels.stall_s) as waited:
            while self._credit <= 0 and not (self._closed or self._broken):
                self._writable = anyio.Event()
                await self._writable.wait()
        if waited.cancelled_caught:
            reason = f"stalled: the other end read nothing for {self._tunnels.stall_s:g} s"
            await self._tunnels.cut(self, reason)
            raise anyio.BrokenResourceError(reason)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while not self._buffer:
            if self._closed:
                raise anyio.ClosedResourceError
            if self._broken:
                raise anyio.BrokenResourceError(self._broken)
            if self._eof:
                raise anyio.EndOfStream
            self._readable = anyio.Event()
            await self._readable.wait()
        data = bytes(self._buffer[:max_bytes])
        del self._buffer[:max_bytes]
        self._unthanked += len(data)
        if self._unthanked >= self._tunnels.window // 4 and not (self._eof or self._broken or self._closed):
            credit, self._unthanked = self._unthanked, 0
            try:
                await self._tunnels.send_message(TunnelCredit(stream=self.number, size=credit))
            except LinkClosed as exc:
                self.broken(str(exc) or "the session ended")
        return data

    async def send_eof(self) -> None:
        # A tunnel closes as a whole; what its users speak (TLS, HTTP/1.1) needs no half-close.
        await self.aclose()

    async def aclose(self) -> None:
        if self._closed:
            return
        told = not (self._eof or self._broken)
        self._closed = True
        self._wake()
        self._tunnels.forget(self.number)
        if told:
            with (
                anyio.CancelScope(shield=True),
                anyio.move_on_after(self._tunnels.stall_s),
                contextlib.suppress(LinkClosed),
            ):
                await self._tunnels.send_message(TunnelClose(stream=self.number))

    def _check_open(self) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        if self._broken:
            raise anyio.BrokenResourceError(self._broken)
        if self._eof:
            raise anyio.BrokenResourceError("the other end closed the tunnel")

    # What the session's reader hands over (synchronous: a tunnel never holds the session up).

    def received(self, payload: bytes) -> str:
        """Take bytes from the other end; a problem (beyond the window) or ``""``."""
        if self._eof or self._broken or self._closed:
            return ""  # in flight when this end closed it: nobody reads them
        if len(self._buffer) + len(payload) > self._tunnels.window:
            return f"tunnel {self.number} sent {len(self._buffer) + len(payload)} bytes unread, beyond its window"
        self._buffer += payload
        self._readable.set()
        return ""

    def credited(self, size: int) -> None:
        """The other end read ``size`` more bytes."""
        self._credit += size
        self._writable.set()

    def ended(self) -> None:
        """The other end closed the tunnel: what was received is read, then the end of the stream."""
        self._eof = True
        self._wake()

    def broken(self, reason: str) -> None:
        """The tunnel can carry nothing more (the session ended, or the other end cut it)."""
        if not self._broken:
            self._broken = reason
        self._wake()

    def _wake(self) -> None:
        self._readable.set()
        self._writable.set()


@final
class Tunnels:
    """The tunnels of one session end, by number: what its reader hands them, and how they send."""

    def __init__(
        self,
        send_frame: SendFrame,
        send_message: SendMessage,
        *,
        window: int = WINDOW,
        stall_s: float = STALL_S,
    ) -> None:
        self.send_frame = send_frame
        self.send_message = send_message
        self.window = window
        self.stall_s = stall_s
        self._streams: dict[int, TunnelStream] = {}
        self._ended = ""

    def __len__(self) -> int:
        return len(self._streams)

    def __contains__(self, number: object) -> bool:
        return number in self._streams

    def add(self, number: int) -> TunnelStream:
        """A new tunnel numbered ``number``. Errors: ValueError if the number is in use;
        ``BrokenResourceError`` once the session has ended."""
        if self._ended:
            raise anyio.BrokenResourceError(self._ended)
        if number in self._streams:
            raise ValueError(f"tunnel {number} is already open")
        stream = TunnelStream(number, self)
        self._streams[number] = stream
        return stream

    def forget(self, number: int) -> None:
        self._streams.pop(number, None)

    def data(self, frame: bytes) -> str:
        """Hand a data frame to its tunnel; a problem to tell the other end about, or ``""``.

        Bytes for a tunnel this end no longer has (closed while they were in flight) are dropped.
        """
        try:
            number, payload = read_data(frame)
        except MessageError as exc:
            return str(exc)
        stream = self._streams.get(number)
        if stream is None:
            return ""
        problem = stream.received(payload)
        if problem:
            self.forget(number)
            stream.broken(problem)
        return problem

    def credit(self, msg: TunnelCredit) -> None:
        if (stream := self._streams.get(msg.stream)) is not None:
            stream.credited(msg.size)

    def close(self, msg: TunnelClose) -> None:
        """The other end closed a tunnel (``reason``: it broke)."""
        stream = self._streams.pop(msg.stream, None)
        if stream is None:
            return
        if msg.reason:
            stream.broken(msg.reason)
        else:
            stream.ended()

    async def cut(self, stream: TunnelStream, reason: str) -> None:
        """Break ``stream`` and tell the other end why."""
        self.forget(stream.number)
        stream.broken(reason)
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.stall_s), contextlib.suppress(LinkClosed):
            await self.send_message(TunnelClose(stream=stream.number, reason=reason))

    def end(self, reason: str) -> None:
        """The session ended: every tunnel breaks with ``reason``, and no new one opens."""
        self._ended = reason or "the session ended"
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.broken(self._ended)
