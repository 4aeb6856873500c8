"""A session's link: frames out, frames in, a ping and a close; neither end knows anything else of the socket.

The edge agent's connection and the hub's session handler are both written against :class:`Link`.
Each role has its real link over a websocket (in ``roles/``); :func:`memory_links` makes a
connected pair over anyio memory object streams, so that either end can be tested against the
other in the same process under virtual time.

A ping is the websocket's own: the other end's transport answers it with a pong without handing
anything to the code reading frames, so keeping an idle session alive costs that code nothing.
Each end notes when it last heard anything from the other (frames and pings alike), which is
what a missed-heartbeat deadline is measured from.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Final, Protocol, final

import anyio
import msgspec
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

__all__ = ["NORMAL_CLOSE", "Frame", "Link", "LinkClosed", "MemoryLink", "OpenLink", "memory_links"]

Frame = bytes | str
"""One message as it travels (the wire codec's JSON; a text frame arrives as ``str``)."""
NORMAL_CLOSE: Final = 1000


class LinkClosed(Exception):
    """The link cannot carry frames any more (closed by either end, or broken); the message says how."""


class Link(Protocol):
    """One session's link to the other end."""

    async def send(self, frame: bytes) -> None:
        """Send one frame. Errors: :class:`LinkClosed`."""
        ...

    async def receive(self) -> Frame:
        """The next frame from the other end. Errors: :class:`LinkClosed`."""
        ...

    async def close(self, code: int = NORMAL_CLOSE, reason: str = "") -> None:
        """Close the link (a websocket close ``code`` and ``reason``); the other end's receive then fails."""
        ...

    async def ping(self) -> None:
        """Send a ping and wait for the other end's pong. Errors: :class:`LinkClosed`."""
        ...

    def heard_at(self) -> float:
        """When (``anyio.current_time()``) anything last arrived from the other end, pings included."""
        ...


class OpenLink(Protocol):
    """Opens a link to ``url`` for the duration of an ``async with``. Errors: :class:`LinkClosed`, :class:`OSError`."""

    def __call__(
        self, url: str, *, headers: Sequence[tuple[bytes, bytes]], ssl_context: ssl.SSLContext | None
    ) -> AbstractAsyncContextManager[Link]: ...


@final
class _Ping(msgspec.Struct, frozen=True):
    """A ping in flight between memory links; its pong sets ``answered``."""

    answered: anyio.Event


@final
class _Pong(msgspec.Struct, frozen=True):
    ping: _Ping


_Carried = Frame | _Ping | _Pong


@final
@dataclass(eq=False, slots=True)
class MemoryLink:
    """One end of a :func:`memory_links` pair.

    As over a websocket, a ping is answered by the receiving end without reaching its reader: here
    while that end is in :meth:`receive` (a session always has a task reading its link).
    """

    _out: MemoryObjectSendStream[_Carried]
    _in: MemoryObjectReceiveStream[_Carried]
    closed_with: tuple[int, str] | None = field(default=None, init=False)
    """The code and reason this end closed the link with, once it did."""
    _heard: float = field(default_factory=anyio.current_time, init=False)

    async def send(self, frame: bytes) -> None:
        await self._put(frame)

    async def receive(self) -> Frame:
        while True:
            try:
                item = await self._in.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                raise LinkClosed("the link is closed") from None
            self._heard = anyio.current_time()
            if isinstance(item, _Ping):
                await self._put(_Pong(item))
            elif isinstance(item, _Pong):
                item.ping.answered.set()
            else:
                return item

    async def ping(self) -> None:
        ping = _Ping(anyio.Event())
        await self._put(ping)
        await ping.answered.wait()

    def heard_at(self) -> float:
        return self._heard

    async def _put(self, item: _Carried) -> None:
        try:
            await self._out.send(item)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise LinkClosed("the link is closed") from None

    async def close(self, code: int = NORMAL_CLOSE, reason: str = "") -> None:
        if self.closed_with is None:
            self.closed_with = (code, reason)
        await self._out.aclose()
        await self._in.aclose()


def memory_links(capacity: float = 16) -> tuple[MemoryLink, MemoryLink]:
    """Two connected ends: what one sends, the other receives (at most ``capacity`` frames in flight each way)."""
    a_out, b_in = anyio.create_memory_object_stream[_Carried](capacity)
    b_out, a_in = anyio.create_memory_object_stream[_Carried](capacity)
    return MemoryLink(a_out, a_in), MemoryLink(b_out, b_in)
