"""A session's link to the hub: frames out, frames in, and a close; the agent knows nothing else of the socket.

The agent's connection code (:mod:`roles.edge.session`) is written against :class:`Link` and
opens links with an :class:`OpenLink`; :mod:`roles.edge.ws_link` is the real one (trio-websocket),
and :func:`memory_links` makes a connected pair over anyio memory object streams, so that the
agent can be tested against a hub in the same process under virtual time.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Final, Protocol, final

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

__all__ = ["Frame", "Link", "LinkClosed", "MemoryLink", "OpenLink", "memory_links"]

Frame = bytes | str
"""One message as it travels (the wire codec's JSON; a text frame arrives as ``str``)."""
NORMAL_CLOSE: Final = 1000


class LinkClosed(Exception):
    """The link cannot carry frames any more (closed by either end, or broken); the message says how."""


class Link(Protocol):
    """One session's link to a hub."""

    async def send(self, frame: bytes) -> None:
        """Send one frame. Errors: :class:`LinkClosed`."""
        ...

    async def receive(self) -> Frame:
        """The next frame from the hub. Errors: :class:`LinkClosed`."""
        ...

    async def close(self, code: int = NORMAL_CLOSE, reason: str = "") -> None:
        """Close the link (a websocket close ``code`` and ``reason``); the other end's receive then fails."""
        ...


class OpenLink(Protocol):
    """Opens a link to ``url`` for the duration of an ``async with``. Errors: :class:`LinkClosed`, :class:`OSError`."""

    def __call__(
        self, url: str, *, headers: Sequence[tuple[bytes, bytes]], ssl_context: ssl.SSLContext | None
    ) -> AbstractAsyncContextManager[Link]: ...


@final
@dataclass(eq=False, slots=True)
class MemoryLink:
    """One end of a :func:`memory_links` pair."""

    _out: MemoryObjectSendStream[Frame]
    _in: MemoryObjectReceiveStream[Frame]
    closed_with: tuple[int, str] | None = field(default=None, init=False)
    """The code and reason this end closed the link with, once it did."""

    async def send(self, frame: bytes) -> None:
        try:
            await self._out.send(frame)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise LinkClosed("the link is closed") from None

    async def receive(self) -> Frame:
        try:
            return await self._in.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise LinkClosed("the link is closed") from None

    async def close(self, code: int = NORMAL_CLOSE, reason: str = "") -> None:
        if self.closed_with is None:
            self.closed_with = (code, reason)
        await self._out.aclose()
        await self._in.aclose()


def memory_links(capacity: float = 16) -> tuple[MemoryLink, MemoryLink]:
    """Two connected ends: what one sends, the other receives (at most ``capacity`` frames in flight each way)."""
    a_out, b_in = anyio.create_memory_object_stream[Frame](capacity)
    b_out, a_in = anyio.create_memory_object_stream[Frame](capacity)
    return MemoryLink(a_out, a_in), MemoryLink(b_out, b_in)
