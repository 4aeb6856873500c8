"""An admitted edge's session, from its Hello until it ends: the hub's side of the protocol.

The handler knows links (:class:`~nodetask.link.Link`), not sockets: the websocket front door
(:mod:`roles.cloud.transport.door`) hands it each authenticated edge's link, and unit tests hand it memory
links. A session:

1. reads the edge's Hello (within ``hello_timeout``), queues Welcome as its first frame and ends
   (:data:`~roles.cloud.sessions.REPLACED`) a session this hub still held for the node;
2. has its Node marked and the node offered to every job runner (``admit``), while it already
   serves frames;
3. serves frames: heartbeats are echoed, acks noted, each report applied in a task of its own
   (and answered only after its write), anything unexpected answered with an Error frame; for an
   edge that listed ``cache.v1`` (and a hub offering it) its cache stream runs meanwhile
   (:mod:`~roles.cloud.cache.streams`), its fetches are answered (those beyond the node's rate of
   keys with a ``rate_limited`` Error) and the Autonomy condition it reports written, at most one
   write per node every interval (:mod:`~roles.cloud.nodes.autonomy_conditions`);
4. ends when the edge goes, when nothing came for ``missed_heartbeats`` intervals
   (:data:`~roles.cloud.sessions.HEARTBEAT_MISSED`), or when the hub ends it
   (:meth:`~roles.cloud.sessions.Session.end`: replaced, not reading, shutting down). The link is
   closed at once with that code; then the hub's mark comes off the Node, if the session was current.

An edge that lists :data:`~nodetask.messages.PING_CAPABILITY` keeps its session alive with
websocket pings, which the link answers within the receive the session always has pending (no frame
reaches the session for them); others send Heartbeats, which are echoed. Either way the deadlines
are kept by one task for all sessions (:meth:`SessionHandler.watch`), which looks at when each link
last heard anything, so that a frame costs no timer of its own.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final

import anyio
import structlog
import trio

from nodetask import messages
from nodetask.link import Link, LinkClosed
from nodetask.messages import (
    PING_CAPABILITY,
    Ack,
    AutonomyCondition,
    CacheFetch,
    Error,
    Heartbeat,
    Hello,
    MessageError,
    NodeCredentialsRequest,
    Report,
    TunnelClose,
    TunnelCredit,
    TunnelOpen,
    Upstream,
    Welcome,
)
from nodetask.names import clip
from nodetask.tunnel import is_data
from roles.cloud.cache.streams import CacheStreams
from roles.cloud.metrics import HubMetrics
from roles.cloud.nodes.autonomy_conditions import AutonomyConditions, condition_problem
from roles.cloud.relay.desk import RelayDesk, SessionRelay
from roles.cloud.sessions import (
    GOING_AWAY,
    HEARTBEAT_MISSED,
    NOT_READING,
    PROTOCOL,
    REPLACED,
    Session,
    SessionTable,
)
from roles.cloud.settings import HubSettings
from roles.cloud.transport.ingress import LogThrottle, warn_throttled

__all__ = ["ServeEdge", "SessionHandler"]

Log = structlog.typing.FilteringBoundLogger

ServeEdge = Callable[[str, Link], Coroutine[Any, Any, None]]
"""Serves one authenticated edge (its node name and link) until its session ends."""

_UNEXPLAINED: Final = "the hub stopped serving it"
_OFFERED: Final = (PING_CAPABILITY,)
"""What this hub lists in its Welcome."""
_NOT_AGREED: Final = f"both ends must list {messages.CACHE_CAPABILITY} for cache and autonomy messages"


class SessionHandler:
    """Serves edge sessions for one hub (:meth:`serve`) and ends them all at shutdown (:meth:`close_all`)."""

    def __init__(
        self,
        *,
        settings: HubSettings,
        sessions: SessionTable,
        metrics: HubMetrics,
        throttle: LogThrottle,
        admit: Callable[[str, str, Log], Coroutine[Any, Any, None]],
        unmark: Callable[[str, Log], Awaitable[None]],
        on_report: Callable[[Session, Report, Log], Coroutine[Any, Any, None]],
        cache: CacheStreams,
        conditions: AutonomyConditions,
        relay: RelayDesk,
        log: Log,
    ) -> None:
        self._settings = settings
        self._sessions = sessions
        self._metrics = metrics
        self._throttle = throttle
        self._admit = admit
        self._unmark = unmark
        self._on_report = on_report
        self._cache = cache
        self._conditions = conditions
        self._relay = relay
        self._log = log
        self._deadline = settings.heartbeat_interval * settings.missed_heartbeats
        self._frames_in = metrics.frames_in
        self._frames_out = metrics.frames_out

    async def serve(self, node: str, link: Link) -> None:
        """Serve ``node``'s edge over ``link`` (its token already checked) until its session ends."""
        log = self._log.bind(node=node)
        hello = await self._hello(link, node, log)
        if hello is None:
            return
        session = Session(
            node=node,
            version=hello.version,
            capabilities=hello.capabilities,
            link=link,
            send_timeout=self._deadline,
            on_sent=self._count_out,
        )
        # Welcome is sent before the session is visible to the runners: it must be the first frame.
        welcome = Welcome(
            hub=self._settings.hub_id,
            heartbeat_interval=self._settings.heartbeat_interval,
            capabilities=(
                *_OFFERED,
                *self._cache.capabilities,
                *self._relay.capabilities,
            ),
        )
        await session.send(welcome, own=True)
        replaced = self._sessions.add(session)
        removed: bool | None = None
        ended = _UNEXPLAINED
        relay: SessionRelay | None = None
        try:
            if replaced is not None:
                log.info("session_replaced")
                replaced.end(REPLACED, "replaced by a newer session")
                with anyio.move_on_after(self._settings.close_grace):
                    await replaced.link_closed.wait()
            log.info("edge_connected", version=clip(hello.version, 64))
            if self._cache.offered(session):
                self._cache.attach(session, log)
            relay = self._relay.attach(session)
            # trio's nurseries, not anyio's task groups, for a session's tasks: anyio gives each task a
            # cancel scope and an event of its own, a fifth of a report's CPU (docs/benchmarks.md).
            async with trio.open_nursery() as tg:
                session.attach(tg.start_soon)
                # The session reads (and echoes heartbeats) while its Node mark waits its turn: a fleet
                # reconnecting at once must not time its sessions out behind thousands of marks.
                tg.start_soon(self._admit, node, hello.version, log)
                try:
                    ended = await self._receive(session, relay, log)
                finally:
                    # Out of the table at once, so nothing more is dispatched to it, while a mark under
                    # way finishes (see NodeMarks.mark) so that the unmark below comes after it.
                    removed = self._sessions.remove(session)
                    tg.cancel_scope.cancel()
        finally:
            current = self._sessions.remove(session) if removed is None else removed
            self._cache.detach(session)
            if relay is not None:
                relay.detach(f"the session ended: {ended}")
            with anyio.CancelScope(shield=True):
                await self._close(session, GOING_AWAY, "")  # nothing to do unless an error ended it
                session.discard_queue()
                if current:
                    await self._unmark(node, log)
            log.info("edge_disconnected", reason=ended)

    async def watch(self) -> None:
        """End the sessions whose edge said nothing, or read nothing, for ``missed_heartbeats`` intervals.

        Wakes when the first of those deadlines comes: anything heard (or a write begun) after a
        pass is due no earlier than a whole deadline later, so one pass sets the next.
        """
        while True:
            now = anyio.current_time()
            wake = now + self._deadline
            for session in self._sessions.all():
                if session.ending is not None:
                    continue  # being closed already
                writing = session.write_due()
                if writing < math.inf:
                    # A write held up also holds up the reading: the edge is not reading.
                    if writing <= now:
                        self._log.warning("edge_not_reading", node=session.node, seconds=self._deadline)
                        session.end(NOT_READING, f"not reading: a frame waited {self._deadline:g} s")
                    else:
                        wake = min(wake, writing)
                    continue
                due = session.link.heard_at() + self._deadline
                if due <= now:
                    self._log.warning("heartbeat_missed", node=session.node, seconds=self._deadline)
                    session.end(HEARTBEAT_MISSED, "no heartbeat")
                else:
                    wake = min(wake, due)
            await anyio.sleep(wake - now)

    async def close_all(self) -> None:
        """End every session with GOING_AWAY; return once their links are closed, or after ``close_grace``."""
        sessions = self._sessions.all()
        if not sessions:
            return
        self._log.info("closing_sessions", count=len(sessions))
        for session in sessions:
            session.end(GOING_AWAY, "hub shutting down")
        with anyio.move_on_after(self._settings.close_grace):
            for session in sessions:
                await session.link_closed.wait()

    async def _close(self, session: Session, code: int, reason: str) -> None:
        try:
            with anyio.move_on_after(self._settings.close_grace, shield=True):
                await session.link.close(code, reason)
        finally:
            session.link_closed.set()

    async def _hello(self, link: Link, node: str, log: Log) -> Hello | None:
        with anyio.move_on_after(self._settings.hello_timeout):
            try:
                frame = await link.receive()
            except LinkClosed:
                return None
            try:
                msg = messages.decode_upstream(frame)
            except MessageError as exc:
                msg = None
                problem = str(exc)
            else:
                problem = (
                    ""
                    if isinstance(msg, Hello) and msg.node == node
                    else "the first frame must be a Hello for this node"
                )
            if isinstance(msg, Hello) and not problem:
                self._count_in("hello")
                return msg
            self._metrics.rejected.labels(reason="bad_hello").inc()
            self._warn(log, "bad_hello", error=clip(problem))
            with contextlib.suppress(LinkClosed):
                # No session and no writer yet: this is the only task using the link.
                await link.send(messages.encode(Error(code="bad_hello", message=clip(problem))))
            await link.close(PROTOCOL, "expected hello")
            return None
        log.warning("hello_timed_out")
        with anyio.move_on_after(self._settings.close_grace):  # an edge that never spoke may not answer either
            await link.close(PROTOCOL, "no hello")
        return None

    async def _receive(self, session: Session, relay: SessionRelay, log: Log) -> str:
        """Serve frames until the edge goes or the session is ended (then closed at once); says which."""
        ended = _UNEXPLAINED
        with session.end_scope:
            async with trio.open_nursery() as reports:
                ended = await self._read(session, relay, reports, log)
                reports.cancel_scope.cancel()
        if session.ending is None:
            return ended
        code, reason = session.ending
        await self._close(session, code, reason)
        return f"closed by the hub with {code}: {reason}"

    async def _read(self, session: Session, relay: SessionRelay, reports: trio.Nursery, log: Log) -> str:
        # No deadline here: watch() keeps it for every session (a timer per frame costs more than the frame).
        link = session.link
        while True:
            try:
                frame = await link.receive()
            except LinkClosed as exc:
                return str(exc)
            if is_data(frame):
                await self._refuse(session, relay.data(frame), log)
                continue
            try:
                msg: Upstream = messages.decode_upstream(frame)
            except MessageError as exc:
                await self._reject(session, "malformed", str(exc), log)
                continue
            self._count_in(str(type(msg).__struct_config__.tag))
            match msg:
                case Heartbeat():
                    await session.send(Heartbeat(sent_at=msg.sent_at), own=True)
                case Ack(id=msg_id):
                    self._acked(session, msg_id)
                case Report():
                    await self._report(session, msg, reports, log)
                case CacheFetch() | AutonomyCondition():
                    await self._autonomy_message(session, msg, log)
                case Error(code=code, message=text):
                    self._warn(log, "edge_error", code=clip(code, 64), error=clip(text))
                case TunnelOpen() | TunnelCredit() | TunnelClose() | NodeCredentialsRequest():
                    await self._refuse(session, relay.message(msg, reports, log), log)
                case Hello():
                    await self._reject(session, "unexpected", "hello was already received", log)

    async def _report(self, session: Session, msg: Report, reports: trio.Nursery, log: Log) -> None:
        if msg.route.node != session.node:
            text = f"report for node {msg.route.node} refused"
            await self._reject(session, "foreign_node", text, log, ref=str(msg.seq))
        else:
            # Each report waits for its write without holding up heartbeats or other reports.
            reports.start_soon(self._on_report, session, msg, log)

    async def _refuse(self, session: Session, refusal: tuple[str, str] | None, log: Log) -> None:
        if refusal is not None:
            await self._reject(session, *refusal, log)

    def _acked(self, session: Session, msg_id: str) -> None:
        latency = session.acked(msg_id)
        if latency is not None:
            self._metrics.ack_latency.observe(latency)

    async def _autonomy_message(self, session: Session, msg: CacheFetch | AutonomyCondition, log: Log) -> None:
        """A cache fetch or an Autonomy condition, from an edge that agreed on ``cache.v1``."""
        if not self._cache.offered(session):
            await self._reject(session, "unexpected", _NOT_AGREED, log)
        elif isinstance(msg, CacheFetch):
            if (refusal := self._cache.fetch(session, msg.keys)) is not None:
                await self._reject(session, refusal.code, refusal.message, log)
        elif refused := condition_problem(msg):
            await self._reject(session, "bad_condition", refused, log)
        else:
            self._conditions.submit(session.node, msg, log)

    async def _reject(self, session: Session, reason: str, text: str, log: Log, *, ref: str = "") -> None:
        self._metrics.rejected.labels(reason=reason).inc()
        self._warn(log, "frame_rejected", reason=reason, error=clip(text))
        await session.send(Error(code=reason, message=clip(text), ref=ref), own=True)

    def _count_in(self, op: str) -> None:
        self._frames_in[op] = self._frames_in.get(op, 0) + 1

    def _count_out(self, op: str) -> None:
        self._frames_out[op] = self._frames_out.get(op, 0) + 1

    def _warn(self, log: Log, event: str, **values: object) -> None:
        warn_throttled(self._throttle, log, event, **values)
