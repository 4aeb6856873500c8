"""An accepted edge connection as bytes in and out: a non-blocking socket, TLS or plain, read in place.

The socket is read and written by whichever task asks, through trio's readiness waits; TLS is
OpenSSL's own over the socket (:class:`ssl.SSLSocket`), not :class:`trio.SSLStream`'s state
machine in Python over memory buffers, which cost about as much CPU per frame as the websocket
above it. One task reads at a time and one writes at a time; with TLS either may need the other
direction first (a handshake record), so what is kept to one task is the wait for each direction
(trio allows no more): a task needing a direction another task already waits for waits for that
task's wait to end instead.
"""

from __future__ import annotations

import socket
import ssl
from typing import Final, final

import trio

__all__ = ["Wire"]

RECEIVE_BYTES: Final = 65536
EAGER_READS: Final = 16
"""Reads that found data without waiting before the reader lets other tasks run: a peer that keeps
the socket full must not keep the hub to itself."""
_READABLE, _WRITABLE = 1, 2


@final
class Wire:
    """One connected socket, owned from here on: :meth:`close` it once."""

    __slots__ = ("_closed", "_drained", "_eager", "_turns", "_waiting", "_writing", "broken", "reading", "sock")

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock: socket.socket = sock
        self.broken = False
        """A write was cut short: the byte stream can no longer be trusted, only closed."""
        self.reading = False
        """A task is in :meth:`receive`."""
        self._writing = False
        self._closed = False
        self._eager = 0
        self._drained = False
        """The last read of a plain socket took less than it asked for: the kernel had no more, and
        reading again before the socket is readable would only fail (a system call and an exception)."""
        self._waiting = 0
        """The directions (:data:`_READABLE`, :data:`_WRITABLE`) a task is waiting for."""
        self._turns: trio.lowlevel.ParkingLot | None = None
        """Tasks waiting for the writer to finish, or for another task's wait on the socket to end
        (made when first needed: most connections never wait for each other)."""

    @classmethod
    def take(cls, stream: trio.SocketStream) -> Wire:
        """Take over the socket of an accepted ``stream`` (which is then unusable)."""
        return cls(socket.socket(fileno=stream.socket.detach()))

    def peer(self) -> str:
        try:
            host, port, *_ = self.sock.getpeername()
        except OSError:
            return "?"
        return f"{host}:{port}"

    async def start_tls(self, context: ssl.SSLContext) -> None:
        """The server side of a TLS handshake. Errors: :class:`OSError` (:class:`ssl.SSLError` included)."""
        self.sock = context.wrap_socket(self.sock, server_side=True, do_handshake_on_connect=False)
        tls = self.sock
        assert isinstance(tls, ssl.SSLSocket)
        while True:
            try:
                tls.do_handshake()
                return
            except ssl.SSLWantReadError:
                await trio.lowlevel.wait_readable(tls)
            except ssl.SSLWantWriteError:
                await trio.lowlevel.wait_writable(tls)

    async def receive(self) -> bytes:
        """Some bytes, or ``b""`` once the peer has closed. Errors: :class:`OSError` (a broken connection)."""
        if self.reading:
            raise trio.BusyResourceError("another task is already reading this connection")
        self.reading = True
        try:
            if self._drained:
                self._drained = False
                self._eager = 0
                await self._wait(_READABLE)
            while True:
                try:
                    data = self.sock.recv(RECEIVE_BYTES)
                except (BlockingIOError, ssl.SSLWantReadError):
                    self._eager = 0
                    await self._wait(_READABLE)
                    continue
                except ssl.SSLWantWriteError:
                    await self._wait(_WRITABLE)
                    continue
                # TLS returns a record at a time, whatever is left in the kernel: only a plain socket's
                # short read says it is empty.
                self._drained = 0 < len(data) < RECEIVE_BYTES and type(self.sock) is socket.socket
                self._eager += 1
                if self._eager >= EAGER_READS:
                    self._eager = 0
                    await trio.lowlevel.cancel_shielded_checkpoint()
                return data
        finally:
            self.reading = False

    async def send(self, data: bytes) -> None:
        """Write all of ``data``; concurrent senders take turns. Errors: :class:`OSError`."""
        while self._writing:
            await self._turn()
        if self.broken or self._closed:
            raise BrokenPipeError("the connection was closed or broken")
        self._writing = True
        view = memoryview(data)
        try:
            while view:
                try:
                    sent = self.sock.send(view)
                except (BlockingIOError, ssl.SSLWantWriteError):
                    await self._wait(_WRITABLE)
                    continue
                except ssl.SSLWantReadError:
                    await self._wait(_READABLE)
                    continue
                view = view[sent:]
        except BaseException:
            if len(view) < len(data) or isinstance(self.sock, ssl.SSLSocket):
                # Part of a frame is out, or OpenSSL holds a record it must be given again:
                # nothing more can follow it.
                self.broken = True
            raise
        finally:
            self._writing = False
            self._progress()

    async def _wait(self, direction: int) -> None:
        """Until the socket is ready in ``direction``, or another task's wait for it has ended."""
        if self._waiting & direction:
            await self._turn()
            return
        self._waiting |= direction
        try:
            if direction == _WRITABLE:
                await trio.lowlevel.wait_writable(self.sock)
            else:
                await trio.lowlevel.wait_readable(self.sock)
        finally:
            self._waiting &= ~direction
            self._progress()

    async def _turn(self) -> None:
        if self._turns is None:
            self._turns = trio.lowlevel.ParkingLot()
        await self._turns.park()

    def _progress(self) -> None:
        if self._turns is not None:
            self._turns.unpark_all()

    def close(self) -> None:
        """Close the socket (idempotent); a task waiting on it gets :class:`trio.ClosedResourceError`."""
        if self._closed:
            return
        self._closed = True
        trio.lowlevel.notify_closing(self.sock)
        self.sock.close()
