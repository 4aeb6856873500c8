"""The edge sessions one hub holds: who is connected, and a way to wait for someone to be.

A node has at most one session per hub: a second connection (the edge reconnected before the hub
noticed the first one die) replaces the first, which is closed.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import trio_websocket

from nodetask import messages
from nodetask.messages import Downstream


class Session:
    """One edge's websocket session."""

    def __init__(
        self,
        *,
        node: str,
        version: str,
        capabilities: tuple[str, ...],
        ws: trio_websocket.WebSocketConnection,
        on_sent: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.node = node
        self.version = version
        self.capabilities = capabilities
        self.ws = ws
        self.closed = anyio.Event()
        self._unacked: dict[str, float] = {}
        self._on_sent = on_sent

    async def send(self, msg: Downstream) -> bool:
        """Send one message; False if the session is gone (the caller waits for the next one)."""
        try:
            await self.ws.send_message(messages.encode(msg))
        except trio_websocket.ConnectionClosed:
            self.closed.set()
            return False
        self._on_sent(str(type(msg).__struct_config__.tag))
        return True

    def expect_ack(self, msg_id: str) -> None:
        """Note that ``msg_id`` is being sent now and should be acknowledged."""
        self._unacked[msg_id] = anyio.current_time()

    def acked(self, msg_id: str) -> float | None:
        """Record an acknowledgement: the seconds since the send, or None if nothing awaited it."""
        sent = self._unacked.pop(msg_id, None)
        return None if sent is None else anyio.current_time() - sent


class SessionTable:
    """The sessions of this hub by node name."""

    def __init__(self) -> None:
        self._by_node: dict[str, Session] = {}
        self._arrival: dict[str, anyio.Event] = {}

    def __len__(self) -> int:
        return len(self._by_node)

    def __contains__(self, node: object) -> bool:
        return node in self._by_node

    def get(self, node: str) -> Session | None:
        return self._by_node.get(node)

    def nodes(self) -> frozenset[str]:
        return frozenset(self._by_node)

    def all(self) -> list[Session]:
        return list(self._by_node.values())

    def add(self, session: Session) -> Session | None:
        """Register ``session``; returns the session it replaces, which the caller closes."""
        old = self._by_node.get(session.node)
        self._by_node[session.node] = session
        arrival = self._arrival.pop(session.node, None)
        if arrival is not None:
            arrival.set()
        return old

    def remove(self, session: Session) -> bool:
        """Unregister ``session`` unless a newer one replaced it; True if it was current."""
        session.closed.set()
        if self._by_node.get(session.node) is session:
            del self._by_node[session.node]
            return True
        return False

    async def wait_for(self, node: str) -> Session:
        """The node's open session, waiting for one if needed."""
        while True:
            session = self._by_node.get(node)
            if session is not None and not session.closed.is_set():
                return session
            await self._arrival.setdefault(node, anyio.Event()).wait()
