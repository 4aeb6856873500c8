"""The edge's end of its session's tunnels: opened on the kubelet's behalf, fed by the session's reader.

One :class:`TunnelClient` lives as long as the agent; each hub session that agreed on
:data:`~nodetask.messages.TUNNEL_CAPABILITY` gives it a fresh :class:`~nodetask.tunnel.Tunnels`
(:meth:`TunnelClient.serve_session`), and its end breaks every tunnel of that session. Between
sessions, or with a hub that does not relay, :meth:`TunnelClient.open` raises :class:`Offline`: the
endpoint then answers from the cache.
"""

from __future__ import annotations

import itertools
from typing import Final, NoReturn, final

import anyio
import anyio.abc
import structlog

from nodetask.link import LinkClosed
from nodetask.messages import TunnelClose, TunnelCredit, TunnelOpen, TunnelOpened
from nodetask.tunnel import Tunnels, TunnelStream
from roles.edge.session import Session

__all__ = ["OPEN_TIMEOUT_S", "Offline", "TunnelClient"]

Log = structlog.typing.FilteringBoundLogger

OPEN_TIMEOUT_S: Final = 10.0
"""How long a tunnel may take to open (the hub connecting to the API server) before the device answers offline."""


class Offline(Exception):
    """No tunnel to the API server can be had now; the message says why."""


@final
class TunnelClient:
    """Opens tunnels to the API server through the current hub session, when there is one that relays."""

    def __init__(self, *, log: Log, open_timeout: float = OPEN_TIMEOUT_S) -> None:
        self._log = log
        self._open_timeout = open_timeout
        self._session: Session | None = None
        self._tunnels: Tunnels | None = None
        self._numbers = itertools.count(1)
        self._pending: dict[int, anyio.Event] = {}
        self.sessions = 0
        """Sessions that relayed so far; a connection made in an earlier one is not reused."""
        self.changed = anyio.Event()
        """Set when a relaying session starts or ends; replaced by a fresh event each time."""

    @property
    def online(self) -> bool:
        """Whether a relaying hub session is up."""
        return self._tunnels is not None

    async def serve_session(self, session: Session, *, task_status: anyio.abc.TaskStatus[None]) -> NoReturn:
        """Open tunnels through ``session`` until cancelled (its end), then break them all."""
        tunnels = Tunnels(session.send_frame, session.send)
        self._session, self._tunnels = session, tunnels
        self.sessions += 1
        self._announce()
        try:
            task_status.started()
            await anyio.sleep_forever()
            raise AssertionError("sleep_forever returned")  # pragma: no cover
        finally:
            self._session = self._tunnels = None
            tunnels.end("the hub session ended")
            for waiting in self._pending.values():
                waiting.set()
            self._pending.clear()
            self._announce()

    def _announce(self) -> None:
        changed, self.changed = self.changed, anyio.Event()
        changed.set()

    def data(self, frame: bytes) -> None:
        """A data frame from the hub (the session's reader hands it over, synchronously)."""
        if self._tunnels is not None and (problem := self._tunnels.data(frame)):
            self._log.warning("tunnel_data_refused", error=problem)

    def handle(self, msg: TunnelOpened | TunnelCredit | TunnelClose) -> None:
        """A tunnel message from the hub."""
        tunnels = self._tunnels
        if tunnels is None:
            return
        match msg:
            case TunnelCredit():
                tunnels.credit(msg)
            case TunnelClose():
                tunnels.close(msg)
                if (waiting := self._pending.pop(msg.stream, None)) is not None:
                    waiting.set()
            case TunnelOpened():
                if (waiting := self._pending.pop(msg.stream, None)) is not None:
                    waiting.set()

    async def open(self) -> TunnelStream:
        """A tunnel to the API server. Errors: :class:`Offline` naming why there is none."""
        session, tunnels = self._session, self._tunnels
        if session is None or tunnels is None:
            raise Offline("no hub session relays to the API server")
        number = next(self._numbers)
        try:
            stream = tunnels.add(number)
        except anyio.BrokenResourceError as exc:
            raise Offline(str(exc)) from None
        opened = self._pending[number] = anyio.Event()
        try:
            await session.send(TunnelOpen(stream=number))
            with anyio.move_on_after(self._open_timeout):
                await opened.wait()
        except LinkClosed as exc:
            await stream.aclose()
            raise Offline(str(exc) or "the hub session ended") from None
        finally:
            self._pending.pop(number, None)
        if stream.problem:
            await stream.aclose()
            raise Offline(stream.problem)
        if not opened.is_set():
            await stream.aclose()
            raise Offline(f"the hub did not open a tunnel within {self._open_timeout:g} s")
        return stream
