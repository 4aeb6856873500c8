"""The edge sessions one hub holds: who is connected, and each session's one writer.

A node has at most one session per hub: a second connection (the edge reconnected before the hub
noticed the first one die) replaces the first, which is closed.

Everything a hub sends an edge (Welcome, RunActions, Confirms, Cancels, report answers, heartbeat
echoes) goes through :meth:`Session.send`, and ONE writer at a time puts frames on the link, in
the order they were sent, so frames never interleave and a slow edge costs at most
``OUTBOUND_QUEUE`` waiting frames of memory. There is no writer task while nothing waits: a frame
sent to an idle session by one of the session's own tasks (its handler, its reports: cancelled
only when the session ends) is written by that task at once; a frame sent while another is being
written waits in the queue, which the writing task drains before it returns; and a frame from
anywhere else (a job's runner, which a finished job cancels) is handed to a writer task started
for it, so that no cancellation can cut a frame in half on a session that goes on.

When the queue is full, a sender waits for room: that is the backpressure of an edge reading
slowly. But it waits at most ``send_timeout`` (the hub gives an edge as long to read as it gives it
to say anything, its missed-heartbeat deadline), and a frame being written that long counts the
same (see :meth:`Session.write_due`): such an edge has stopped reading, and its session is closed
with :data:`NOT_READING`, so that no runner, report or heartbeat waits on it forever and the edge,
if it is alive, reconnects.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Coroutine
from typing import Any, Final

import anyio
import trio

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


Spawn = Callable[[Callable[[], Coroutine[Any, Any, None]]], object]
"""Starts a task (a task group's or nursery's ``start_soon``)."""


class Session:
    """One edge's session over ``link``. Its handler gives it a way to start writer tasks (:meth:`attach`)
    and closes the link."""

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
        self._queue: list[tuple[bytes, str]] = []
        self._writing = False
        self._writing_since = math.inf
        self._room: anyio.Event | None = None
        self._spawn: Spawn | None = None

    def attach(self, spawn: Spawn) -> None:
        """Start writer tasks with ``spawn`` from now on (the handler's, whose tasks end with the session)."""
        self._spawn = spawn
        if self._queue and not self._writing:
            self._start_writer()

    async def send(self, msg: Downstream, *, own: bool = False) -> bool:
        """Send one message; False if the session is gone (the caller waits for the next one).

        ``own``: the caller is one of the session's own tasks (cancelled only when the session
        ends), which may write the frame itself when nothing else is being written.

        Waits while the queue is full, for at most ``send_timeout``; then the edge is taken as not
        reading, the session is ended with :data:`NOT_READING` and False is returned.
        """
        return await self.send_frame(messages.encode(msg), str(type(msg).__struct_config__.tag), own=own)

    async def send_frame(self, frame: bytes, op: str, *, own: bool = False) -> bool:
        """:meth:`send` for a frame already encoded (``op`` names it in the metrics): a tunnel's bytes."""
        if self.closed.is_set():
            return False
        item = (frame, op)
        if self._writing or self._queue or not own:
            return await self._enqueue(item)
        self._writing = True
        try:
            if await self._write(item):
                await self._drain()
                return True
            return False
        finally:
            self._writing = False
            if self._queue:  # cancelled while draining: what is left needs a writer
                self._start_writer()

    def offer(self, frame: bytes, op: str) -> bool:
        """Queue an encoded frame (``op`` is its tag) without waiting; False if the queue is full or the
        session gone. For senders that must never wait on one edge (the shared cache streams)."""
        if self.closed.is_set() or len(self._queue) >= OUTBOUND_QUEUE:
            return False
        self._queue.append((frame, op))
        if not self._writing:
            self._start_writer()
        return True

    async def _enqueue(self, item: tuple[bytes, str]) -> bool:
        if len(self._queue) >= OUTBOUND_QUEUE:
            with anyio.move_on_after(self._send_timeout):
                while len(self._queue) >= OUTBOUND_QUEUE and not self.closed.is_set():
                    if self._room is None:
                        self._room = anyio.Event()
                    await self._room.wait()
            if len(self._queue) >= OUTBOUND_QUEUE and not self.closed.is_set():
                self.end(NOT_READING, f"not reading: {OUTBOUND_QUEUE} frames waited {self._send_timeout:g} s")
        if self.closed.is_set() or len(self._queue) >= OUTBOUND_QUEUE:
            return False
        self._queue.append(item)
        if not self._writing:
            self._start_writer()
        return True

    def _start_writer(self) -> None:
        if self._spawn is not None and not self.closed.is_set():
            self._writing = True
            self._spawn(self._write_queued)

    async def _write_queued(self) -> None:
        try:
            await self._drain()
        finally:
            self._writing = False

    async def _drain(self) -> None:
        while self._queue:
            item = self._queue.pop(0)
            if self._room is not None:
                self._room.set()
                self._room = None
            if not await self._write(item):
                return

    async def _write(self, item: tuple[bytes, str]) -> bool:
        frame, op = item
        self._writing_since = trio.current_time()  # on every frame: anyio's costs four times as much
        try:
            await self.link.send(frame)
        except LinkClosed:
            self.closed.set()
            return False
        finally:
            self._writing_since = math.inf
        self._on_sent(op)
        return True

    def write_due(self) -> float:
        """When the frame being written will have taken ``send_timeout`` (the edge is then not reading);
        infinity while none is."""
        return self._writing_since + self._send_timeout

    def end(self, code: int, reason: str) -> None:
        """Ask the session's handler to close it with ``code`` (the first reason asked for wins)."""
        if self.ending is None:
            self.ending = (code, reason)
        self.end_scope.cancel()

    def discard_queue(self) -> None:
        """Stop taking messages (the handler is done with the session); whatever is queued is dropped."""
        self.closed.set()
        self._queue.clear()
        if self._room is not None:
            self._room.set()  # wakes the senders waiting for room

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
