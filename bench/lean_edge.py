"""A bare edge for load: the websocket handshake, Hello, pings and frames over a raw socket, nothing else.

The hub-capacity series measures the hub; its fleet runs on the same two cores. A
:class:`~tools.doubles.lightedge.LightEdge` (trio-websocket: a reader task, a nursery, channels and
an HTTP parser per connection) cost the fleet 5.7 to 7.4 ms of CPU per reconnect, several times
the hub's own 1.3 ms, so a reconnect storm timed how fast the fleet could dial, not how fast the hub
could take it. This edge speaks the same protocol to the hub (RFC 6455 client frames, the token in
the upgrade, Hello then pings every heartbeat interval, as the agent does) with one task per edge
while it idles and one more for its pings. What it leaves out is what the benchmark does not use:
it runs no actions, keeps no outbox, and does not check the server's ``Sec-WebSocket-Accept``.

Client frames carry a zero masking key: masking is required of a client and the hub unmasks every
frame, but the key only matters to intermediaries, and there are none on loopback.
"""

from __future__ import annotations

import base64
import contextlib
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import trio

from nodetask import messages
from nodetask.backoff import Backoff
from nodetask.messages import PING_CAPABILITY, Error, Hello, ReportAck, Welcome

__all__ = ["LeanEdge"]

_TEXT, _BINARY, _CLOSE, _PING, _PONG = 0x1, 0x2, 0x8, 0x9, 0xA
_DATA: Final = frozenset({_TEXT, _BINARY})
_ZERO_MASK: Final = b"\0\0\0\0"
_RECEIVE: Final = 65536


class _Gone(Exception):
    """The connection ended or the hub answered something this edge does not expect."""


def client_frame(opcode: int, payload: bytes) -> bytes:
    """One final client frame (masked with the zero key)."""
    size = len(payload)
    if size < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | size)
    elif size < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, size)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, size)
    return head + _ZERO_MASK + payload


def server_frames(buffer: bytearray) -> list[tuple[int, bytes]]:
    """The whole (unmasked, unfragmented) frames at the front of ``buffer``, removed from it."""
    frames: list[tuple[int, bytes]] = []
    while len(buffer) >= 2:
        first, second = buffer[0], buffer[1]
        if not first & 0x80 or second & 0x80:
            raise _Gone("a fragmented or masked frame from the hub")
        size, start = second & 0x7F, 2
        if size == 126:
            if len(buffer) < 4:
                break
            size, start = struct.unpack_from("!H", buffer, 2)[0], 4
        elif size == 127:
            if len(buffer) < 10:
                break
            size, start = struct.unpack_from("!Q", buffer, 2)[0], 10
        if len(buffer) < start + size:
            break
        frames.append((first & 0x0F, bytes(buffer[start : start + size])))
        del buffer[: start + size]
    return frames


@dataclass(slots=True, eq=False)
class LeanEdge:
    """One edge at ``host:port``. Run :meth:`run` in a nursery; cancel it to stop the edge."""

    node: str
    host: str
    port: int
    token: str
    reconnect_delay: float = 0.5
    reconnect_cap: float = 30.0

    connects: int = 0
    acked: int = 0
    errors: int = 0
    _sock: trio.socket.SocketType | None = None
    _send_lock: trio.StrictFIFOLock = field(default_factory=trio.StrictFIFOLock)
    _pongs: list[trio.Event] = field(default_factory=list)
    _request: bytes = b""

    @property
    def connected(self) -> bool:
        return self._sock is not None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, serve, and reconnect with the agent's backoff after every loss; ready once first welcomed."""
        key = base64.b64encode(os.urandom(16)).decode()
        self._request = (
            f"GET /nodes/{self.node} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Authorization: Bearer {self.token}\r\n\r\n"
        ).encode()
        backoff = Backoff(initial=self.reconnect_delay, cap=self.reconnect_cap)
        status: list[trio.TaskStatus[None]] = [task_status]

        def welcomed() -> None:
            backoff.reset()
            if status:
                status.pop().started()

        while True:
            try:
                await self._session(welcomed)
            except* (OSError, _Gone):  # the session's nursery wraps what ends it
                pass
            await trio.sleep(backoff.delay())

    async def _session(self, welcomed: Callable[[], None]) -> None:
        """Connect, say Hello, and serve until the connection ends (which raises)."""
        sock = trio.socket.socket()
        try:
            await sock.connect((self.host, self.port))
            await sock.send(self._request)
            buffer = bytearray()
            while b"\r\n\r\n" not in buffer:
                buffer += await self._receive(sock)
            head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 101"):
                raise _Gone(head.split(b"\r\n", 1)[0].decode(errors="replace"))
            buffer = bytearray(rest)
            hello = Hello(
                node=self.node, version="v1.0.0", capabilities=(messages.ATTEMPTS_CAPABILITY, PING_CAPABILITY)
            )
            await sock.send(client_frame(_BINARY, messages.encode(hello)))
            welcome = await self._welcome(sock, buffer)
            self.connects += 1
            self._sock = sock
            welcomed()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._keepalive, welcome.heartbeat_interval)
                await self._serve(sock, buffer)
        finally:
            self._sock = None
            for pong in self._pongs:
                pong.set()
            self._pongs.clear()
            sock.close()

    @staticmethod
    async def _receive(sock: trio.socket.SocketType) -> bytes:
        data = await sock.recv(_RECEIVE)
        if not data:
            raise _Gone("closed by the hub")
        return data

    async def _welcome(self, sock: trio.socket.SocketType, buffer: bytearray) -> Welcome:
        while True:
            for opcode, payload in server_frames(buffer):
                if opcode not in _DATA:
                    raise _Gone(f"frame {opcode} before the Welcome")
                welcome = messages.decode_downstream(payload)
                if not isinstance(welcome, Welcome):
                    raise _Gone(f"expected a Welcome, got {type(welcome).__name__}")
                return welcome
            buffer += await self._receive(sock)

    async def _serve(self, sock: trio.socket.SocketType, buffer: bytearray) -> None:
        while True:
            for opcode, payload in server_frames(buffer):
                if opcode == _PONG:
                    if self._pongs:
                        self._pongs.pop(0).set()
                elif opcode == _CLOSE:
                    raise _Gone("close frame from the hub")
                elif opcode in _DATA:
                    match messages.decode_downstream(payload):
                        case ReportAck():
                            self.acked += 1
                        case Error():
                            self.errors += 1
                        case _:
                            pass  # heartbeat echoes, and nothing else is sent to an edge with no job
            buffer += await self._receive(sock)

    async def _keepalive(self, interval: float) -> None:
        while True:
            await trio.sleep(interval)
            await self.ping()

    async def _send(self, frame: bytes) -> None:
        sock = self._sock
        if sock is None:
            return
        async with self._send_lock:
            view = memoryview(frame)
            while view:
                view = view[await sock.send(view) :]

    async def send(self, msg: messages.Message) -> None:
        """Send one message when connected (else nothing: this edge keeps no outbox)."""
        with contextlib.suppress(OSError):
            await self._send(client_frame(_BINARY, messages.encode(msg)))

    async def ping(self) -> None:
        """Ping the hub and wait for its pong (or for the connection to end), when connected."""
        if self._sock is None:
            return
        pong = trio.Event()
        self._pongs.append(pong)
        try:
            await self._send(client_frame(_PING, b""))
        except OSError:
            return
        await pong.wait()
