"""The agent's connection to a hub: one session at a time, tried URL after URL with capped, jittered backoff.

A session says ``hello``, waits for the ``welcome``, then runs until its link fails:

* every outbound frame (acks, reports, heartbeats, best-effort failures) goes through ONE writer
  task fed by a bounded queue (:class:`Session`), so frames never interleave on the link and a
  slow hub slows the senders down instead of piling frames up in memory;
* the outbox is fed to it first, in ``seq`` order (:meth:`roles.edge.outbox.Outbox.feed`);
* a heartbeat goes out every interval the hub asked for, and a hub silent for
  ``missed_heartbeats`` intervals counts as gone: the session ends and the loop reconnects. When
  both sides list :data:`~nodetask.messages.PING_CAPABILITY` the heartbeat is a websocket ping,
  which the hub's transport answers without waking the hub's session code, and a ping unanswered
  for those intervals ends the session (a ping is a control frame, which the websocket layer puts
  between whole frames of the writer's: it need not wait behind them);
* every frame from the hub is decoded and handed to the agent's :class:`Dispatch`;
* the agent's :class:`SessionStarted`, if any, runs beside the session for as long as it lasts.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable
from typing import Final, NoReturn, Protocol, final

import anyio
import anyio.abc
import msgspec
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from nodetask import messages
from nodetask.backoff import Backoff
from nodetask.link import Link, LinkClosed, OpenLink
from nodetask.messages import PING_CAPABILITY, Downstream, Heartbeat, Hello, MessageError, Upstream, Welcome
from nodetask.tunnel import is_data
from roles.edge.outbox import Outbox
from roles.edge.settings import AgentSettings

__all__ = ["Dispatch", "HubConnection", "Session", "SessionStarted"]

Log = structlog.typing.FilteringBoundLogger

HELLO_TIMEOUT_S: Final = 10.0
OUTBOUND_QUEUE: Final = 64
"""Frames waiting for a session's writer; a sender waits while the queue is full."""
FIRST_RETRY_S: Final = 0.5


class _Outgoing(msgspec.Struct, frozen=True):
    msg: Upstream | bytes
    """A message, or a frame already encoded (a tunnel's bytes)."""
    written: anyio.Event | None = None
    """Set by the writer once the frame is on the link, for a sender that waits for that."""


@final
class Session:
    """A live session's outbound side: :meth:`send` queues a message for its one writer task."""

    def __init__(self, queue: MemoryObjectSendStream[_Outgoing], *, capabilities: tuple[str, ...] = ()) -> None:
        self._queue = queue
        self.capabilities = frozenset(capabilities)
        """What the hub listed in its Welcome."""

    async def send(self, msg: Upstream) -> None:
        """Queue ``msg`` for the hub. Errors: :class:`LinkClosed` once the session has ended."""
        await self._put(_Outgoing(msg))

    async def send_frame(self, frame: bytes) -> None:
        """Queue an encoded frame (a tunnel's bytes) for the hub. Errors: :class:`LinkClosed`."""
        await self._put(_Outgoing(frame))

    async def send_and_wait(self, msg: Upstream) -> None:
        """Queue ``msg`` and wait until the writer has put it on the link. Errors: :class:`LinkClosed`."""
        written = anyio.Event()
        await self._put(_Outgoing(msg, written))
        await written.wait()

    async def _put(self, item: _Outgoing) -> None:
        try:
            await self._queue.send(item)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise LinkClosed("the session ended") from None


class Dispatch(Protocol):
    """The agent's handling of one message from the hub, answering through ``session``."""

    async def __call__(self, msg: Downstream, session: Session) -> None: ...


class SessionStarted(Protocol):
    """What runs beside a session from its Welcome until it ends (it is cancelled then); ready through
    ``task_status`` before any frame of the hub's after the Welcome is dispatched."""

    async def __call__(
        self, session: Session, welcome: Welcome, *, task_status: anyio.abc.TaskStatus[None]
    ) -> None: ...


@final
class HubConnection:
    """Keeps one hub session at a time until cancelled (:meth:`run`)."""

    def __init__(
        self,
        *,
        settings: AgentSettings,
        open_link: OpenLink,
        capabilities: tuple[str, ...],
        outbox: Outbox,
        dispatch: Dispatch,
        log: Log,
        started: SessionStarted | None = None,
        tunnel_data: Callable[[bytes], None] | None = None,
    ) -> None:
        self._settings = settings
        self._started = started
        self._tunnel_data = tunnel_data
        self._open_link = open_link
        self._capabilities = capabilities
        self._outbox = outbox
        self._dispatch = dispatch
        self._log = log
        self.connected = anyio.Event()
        """Set while a session is up; replaced by a fresh event when it ends."""
        self.connects = 0
        """Sessions established since the agent started."""
        self.session: Session | None = None
        self.hub = ""
        """The hub the current session is with (its id as it said in Welcome), empty between sessions."""

    async def wait_connected(self, within: float) -> bool:
        """Whether a hub session is (or becomes, within ``within`` seconds) established."""
        with anyio.move_on_after(within):
            while not self.connected.is_set():
                await self.connected.wait()
            return True
        return False

    async def send_now(self, msg: Upstream) -> None:
        """Send ``msg`` if a session is up; nothing otherwise (best effort, nothing to acknowledge)."""
        session = self.session
        if session is None:
            return
        with contextlib.suppress(LinkClosed):
            await session.send(msg)

    async def run(self) -> None:
        """Connect, hold the session while it lasts, back off, try the next URL; until cancelled."""
        backoff = Backoff(initial=FIRST_RETRY_S, cap=self._settings.reconnect_cap)
        for url in itertools.cycle(self._settings.hub_urls):
            try:
                # A session always ends by raising: the backoff starts over once one was welcomed.
                await self._session(url, welcomed=backoff.reset)
            except* (OSError, LinkClosed, MessageError) as group:
                self._log.info("hub_connection_lost", url=url, error=str(group.exceptions[0]))
            await anyio.sleep(backoff.delay())

    async def _session(self, url: str, *, welcomed: Callable[[], None]) -> None:
        settings = self._settings
        headers = [(b"authorization", f"Bearer {settings.token}".encode())]
        endpoint = f"{url.rstrip('/')}/nodes/{settings.node}"
        tls = settings.ssl_context if url.startswith("wss://") else None
        async with self._open_link(endpoint, headers=headers, ssl_context=tls) as link:
            hello = Hello(node=settings.node, version=settings.version, capabilities=self._capabilities)
            await link.send(messages.encode(hello))
            with anyio.fail_after(HELLO_TIMEOUT_S):
                welcome = messages.decode_downstream(await link.receive())
            if not isinstance(welcome, Welcome):
                raise MessageError(f"expected a welcome from {url}, got {type(welcome).__name__}")
            welcomed()
            queue, outbound = anyio.create_memory_object_stream[_Outgoing](OUTBOUND_QUEUE)
            session = Session(queue, capabilities=welcome.capabilities)
            self.connects += 1
            self.connected.set()
            self.session = session
            self.hub = welcome.hub
            self._log.info("hub_connected", hub=welcome.hub, url=url)
            deadline = welcome.heartbeat_interval * settings.missed_heartbeats
            pings = PING_CAPABILITY in welcome.capabilities and PING_CAPABILITY in self._capabilities
            try:
                async with queue, outbound, anyio.create_task_group() as tg:
                    tg.start_soon(self._write, link, outbound)
                    if pings:
                        tg.start_soon(self._ping, link, welcome.heartbeat_interval, deadline)
                    else:
                        tg.start_soon(self._heartbeat, session, welcome.heartbeat_interval)
                    tg.start_soon(self._outbox.feed, session.send)
                    if self._started is not None:
                        await tg.start(self._started, session, welcome)
                    # With pings, a hub may rightly send nothing for longer: its pongs say it is there.
                    await self._receive(link, session, math.inf if pings else deadline)
            finally:
                self.connected = anyio.Event()
                self.session = None
                self.hub = ""

    async def _write(self, link: Link, outbound: MemoryObjectReceiveStream[_Outgoing]) -> None:
        async for item in outbound:
            await link.send(item.msg if isinstance(item.msg, bytes) else messages.encode(item.msg))
            if item.written is not None:
                item.written.set()

    async def _heartbeat(self, session: Session, interval: float) -> NoReturn:
        while True:
            # Waiting until it is written: heartbeats never pile up behind a link that does not move.
            await session.send_and_wait(Heartbeat(sent_at=anyio.current_time()))
            await anyio.sleep(interval)

    async def _ping(self, link: Link, interval: float, deadline: float) -> NoReturn:
        while True:
            with anyio.fail_after(deadline):
                await link.ping()
            await anyio.sleep(interval)

    async def _receive(self, link: Link, session: Session, deadline: float) -> NoReturn:
        while True:
            with anyio.fail_after(deadline):
                frame = await link.receive()
            if self._tunnel_data is not None and is_data(frame):
                self._tunnel_data(frame)
                continue
            try:
                msg = messages.decode_downstream(frame)
            except MessageError as exc:
                self._log.warning("bad_frame_from_hub", error=str(exc))
                continue
            await self._dispatch(msg, session)
