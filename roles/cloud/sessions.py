"""The edge sessions one hub holds: who is connected, and each session's one writer.

A node has at most one session per hub: a second connection (the edge reconnected before the hub
noticed the first one die) replaces the first, which is closed.

Everything a hub sends an edge (Welcome, RunActions, Confirms, Cancels, report answers, heartbeat
echoes) goes through :meth:`Session.send` into a bounded queue that ONE writer task
(:meth:`Session.write`) drains onto the link, so frames never interleave and a slow edge costs at
most ``OUTBOUND_QUEUE`` frames of memory. When the queue is full, a sender waits for room: that is
the backpressure of an edge reading slowly. But it waits at most ``send_timeout`` (the hub gives an
edge as long to read as it gives it to say anything, its missed-heartbeat deadline): an edge whose
queue stays full that long has stopped reading, and its session is closed with
:data:`NOT_READING`, so that no runner, report or heartbeat waits on it forever and the edge, if it
is alive, reconnects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import anyio

from nodetask import messages
from nodetask.link import Link, LinkClosed
from nodetask.messages import Downstream

__all__ = [
    "GOING_AWAY",
    "HEARTBEAT_MISSED",
    "NOT_READING",
    "OUTBOUND_QUEUE",
    "PROTOCOL",
    "REPLACED",
    "Session",
    "SessionTable",
]

# Websocket close codes a hub ends sessions with; an edge reconnects after any of them.
GOING_AWAY: Final = 1001
PROTOCOL: Final = 1002
HEARTBEAT_MISSED: Final = 4008
REPLACED: Final = 4009
NOT_READING: Final = 4010

OUTBOUND_QUEUE: Final = 64
"""Frames waiting for a session's writer. A node has a few in flight per job plus report answers."""


class Session:
    """One edge's session over ``link``. Its handler runs :meth:`write` and closes the link."""

    def __init__(
        self,
        *,
        node: str,
        version: str,
        capabilities: tuple[str, ...],
        link: Link,
        send_timeout: float,
        on_sent: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.node = node
        self.version = version
        self.capabilities = capabilities
        self.link = link
        self.closed = anyio.Event()
        """Set once the session is out of the table or its link failed: runners wait for the next one."""
        self.ending: tuple[int, str] | None = None
        """The close code and reason the session is being ended with by the hub, once it is."""
        self.end_scope = anyio.CancelScope()
        """The scope its handler serves frames in; :meth:`end` cancels it."""
        self.link_closed = anyio.Event()
        """Set once the handler has closed the link (or given up within its grace)."""
        self._send_timeout = send_timeout
        self._unacked: dict[str, tuple[float, anyio.Event]] = {}
        self._on_sent = on_sent
        self._queue, self._outbound = anyio.create_memory_object_stream[tuple[bytes, str]](OUTBOUND_QUEUE)

    async def send(self, msg: Downstream) -> bool:
        """Queue one message for the writer; False if the session is gone (the caller waits for the next one).

        Waits while the queue is full, for at most ``send_timeout``; then the edge is taken as not
        reading, the session is ended with :data:`NOT_READING` and False is returned.
        """
        if self.closed.is_set():
            return False
        item = (messages.encode(msg), str(type(msg).__struct_config__.tag))
        try:
            self._queue.send_nowait(item)
            return True
        except anyio.WouldBlock:
            pass
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return False
        with anyio.move_on_after(self._send_timeout):
            try:
                await self._queue.send(item)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                return False
            return True
        self.end(NOT_READING, f"not reading: {OUTBOUND_QUEUE} frames waited {self._send_timeout:g} s")
        return False

    def offer(self, frame: bytes, op: str) -> bool:
        """Queue an encoded frame (``op`` is its tag) without waiting; False if the queue is full or the
        session gone. For senders that must never wait on one edge (the shared cache streams)."""
        if self.closed.is_set():
            return False
        try:
            self._queue.send_nowait((frame, op))
        except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
            return False
        return True

    async def write(self) -> None:
        """The session's one writer: send the queued frames in order until the link fails or this is cancelled."""
        async with self._outbound:
            async for frame, op in self._outbound:
                try:
                    await self.link.send(frame)
                except LinkClosed:
                    self.closed.set()
                    return
                self._on_sent(op)

    def end(self, code: int, reason: str) -> None:
        """Ask the session's handler to close it with ``code`` (the first reason asked for wins)."""
        if self.ending is None:
            self.ending = (code, reason)
        self.end_scope.cancel()

    def discard_queue(self) -> None:
        """Stop taking messages (the handler is done with the session); whatever is queued is dropped."""
        self._outbound.close()  # wakes the senders waiting for room
        self._queue.close()

    def expect_ack(self, msg_id: str) -> anyio.Event:
        """Note that ``msg_id`` is being sent now and should be acknowledged; the event is set when it is."""
        acked = anyio.Event()
        self._unacked[msg_id] = (anyio.current_time(), acked)
        return acked

    def acked(self, msg_id: str) -> float | None:
        """Record an acknowledgement: the seconds since the send, or None if nothing awaited it."""
        sent = self._unacked.pop(msg_id, None)
        if sent is None:
            return None
        sent[1].set()
        return anyio.current_time() - sent[0]


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
        """Register ``session``; returns the session it replaces, which the caller ends."""
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
