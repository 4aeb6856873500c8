"""The real :class:`~nodetask.link.Link`: a trio-websocket client connection.

trio-websocket's errors stay here: a failed handshake and a closed connection both become
:class:`~nodetask.link.LinkClosed`, so the agent handles one kind of lost link.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import final

import trio
import trio_websocket

from nodetask.link import NORMAL_CLOSE, Frame, Link, LinkClosed

__all__ = ["open_ws_link"]


def _closed(exc: Exception) -> LinkClosed:
    # Handshake errors often carry no text of their own, only their cause (the OSError).
    detail = str(exc) or str(exc.__cause__ or "") or type(exc).__name__
    return LinkClosed(detail)


@final
@dataclass(eq=False, slots=True)
class _WebSocketLink:
    ws: trio_websocket.WebSocketConnection
    _heard: float = field(default_factory=trio.current_time, init=False)

    async def send(self, frame: bytes) -> None:
        try:
            await self.ws.send_message(frame)
        except trio_websocket.ConnectionClosed as exc:
            raise _closed(exc) from None

    async def receive(self) -> Frame:
        try:
            frame = await self.ws.get_message()
        except trio_websocket.ConnectionClosed as exc:
            raise _closed(exc) from None
        self._heard = trio.current_time()
        return frame

    async def ping(self) -> None:
        try:
            await self.ws.ping()
        except trio_websocket.ConnectionClosed as exc:
            raise _closed(exc) from None
        self._heard = trio.current_time()

    def heard_at(self) -> float:
        return self._heard

    async def close(self, code: int = NORMAL_CLOSE, reason: str = "") -> None:
        await self.ws.aclose(code, reason)


@asynccontextmanager
async def open_ws_link(
    url: str, *, headers: Sequence[tuple[bytes, bytes]], ssl_context: ssl.SSLContext | None
) -> AsyncIterator[Link]:
    """A websocket to ``url`` (``ws://`` or ``wss://`` with ``ssl_context``), closed when the block ends."""
    try:
        async with trio_websocket.open_websocket_url(url, ssl_context=ssl_context, extra_headers=list(headers)) as ws:
            yield _WebSocketLink(ws)
    except (trio_websocket.HandshakeError, trio_websocket.ConnectionClosed) as exc:
        raise _closed(exc) from exc
