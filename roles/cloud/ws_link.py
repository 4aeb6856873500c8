"""The hub's real :class:`~nodetask.link.Link`: an accepted trio-websocket server connection.

trio-websocket's errors stay here: a closed connection becomes :class:`~nodetask.link.LinkClosed`,
so that the session handler knows nothing of the socket. trio-websocket's reader answers an edge's
pings itself; the stream it reads through (:class:`~roles.cloud.ingress.PeerWatch`) notes when
anything arrived, which is what the session's missed-heartbeat deadline is measured from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

import trio_websocket

from nodetask.link import NORMAL_CLOSE, Frame, LinkClosed
from roles.cloud.ingress import PeerWatch

__all__ = ["WebSocketLink"]


@final
@dataclass(eq=False, slots=True)
class WebSocketLink:
    """An edge's accepted websocket as a link."""

    ws: trio_websocket.WebSocketConnection
    stream: PeerWatch
    """The stream under ``ws``."""

    async def send(self, frame: bytes) -> None:
        try:
            await self.ws.send_message(frame)
        except trio_websocket.ConnectionClosed as exc:
            raise LinkClosed(str(exc.reason)) from None

    async def receive(self) -> Frame:
        try:
            return await self.ws.get_message()
        except trio_websocket.ConnectionClosed as exc:
            raise LinkClosed(str(exc.reason)) from None

    async def close(self, code: int = NORMAL_CLOSE, reason: str = "") -> None:
        await self.ws.aclose(code, reason)

    async def ping(self) -> None:
        try:
            await self.ws.ping()
        except trio_websocket.ConnectionClosed as exc:
            raise LinkClosed(str(exc.reason)) from None

    def heard_at(self) -> float:
        return self.stream.heard_at
