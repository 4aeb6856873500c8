"""Devices' tunnels to the API server: connected by the hub, their bytes passed both ways unread.

A device's agent serves its kubelet the cluster's API through a tunnel in its session
(:mod:`nodetask.tunnel`) and speaks TLS inside it with its node's own client certificate. The hub
connects each tunnel to the API server it uses itself (the address in its kubeconfig: a device names
none, so a tunnel reaches nothing else) and relays ciphertext: the API server's Node authorizer and
NodeRestriction then decide what the device may do, as for any kubelet holding that node's
credentials, and the hub gains no power to act as anyone. A hub relays only with
``apiRelay.enabled``, to edges that list :data:`~nodetask.messages.TUNNEL_CAPABILITY`.

Each tunnel costs the hub one connection and a task per direction, so a node may hold at most
``max_tunnels`` at once (a kubelet holds a dozen: its watches and a few requests); a tunnel asked
beyond that, or that cannot be connected within ``connect_timeout``, is closed with the reason.
A tunnel whose device stops reading is cut by the flow control (:data:`nodetask.tunnel.STALL_S`)
without holding up the session's other frames.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Final, final

import anyio
import anyio.abc
import structlog

from nodetask.link import LinkClosed
from nodetask.messages import TUNNEL_CAPABILITY, TunnelClose, TunnelCredit, TunnelOpen, TunnelOpened
from nodetask.tunnel import HEADER_BYTES, MAX_PAYLOAD, Tunnels, TunnelStream
from roles.cloud.metrics import HubMetrics
from roles.cloud.sessions import Session

__all__ = ["ApiAddress", "ApiRelay", "SessionTunnels"]

Log = structlog.typing.FilteringBoundLogger

DEFAULT_CONNECT_TIMEOUT: Final = 10.0


@dataclass(frozen=True, slots=True)
class ApiAddress:
    """Where the API server listens, as the hub reaches it."""

    host: str
    port: int


def _connect_failure(exc: OSError | TimeoutError) -> tuple[str, str]:
    """Why a tunnel could not be connected, as the device is told it, and the metric's outcome."""
    # anyio's connect_tcp says "All connection attempts failed", the errors themselves in its cause.
    cause = exc.__cause__
    errors = [exc, *((cause,) if isinstance(cause, OSError) else getattr(cause, "exceptions", ()))]
    if any(isinstance(e, OSError) and e.errno in (errno.EMFILE, errno.ENFILE) for e in errors):
        # Each tunnel costs the hub a descriptor: the hub's limit, not the API server's fault.
        return "the hub has no file descriptor left for another tunnel (raise its open-files limit)", "hub_full"
    return f"the hub cannot reach the API server: {str(exc) or type(exc).__name__}", "unreachable"


@final
class SessionTunnels:
    """One session's tunnels on the hub's side: the multiplexer and the session it sends on."""

    def __init__(self, session: Session, tunnels: Tunnels) -> None:
        self.session = session
        self.tunnels = tunnels


@final
class ApiRelay:
    """Connects devices' tunnels to the API server at ``address`` (None: the relay is off)."""

    def __init__(
        self,
        address: ApiAddress | None,
        *,
        metrics: HubMetrics,
        max_tunnels: int,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        self._address = address
        self._metrics = metrics
        self._max_tunnels = max_tunnels
        self._connect_timeout = connect_timeout
        self._bytes = metrics.tunnel_bytes

    @property
    def capabilities(self) -> tuple[str, ...]:
        """What the hub lists in its Welcome for the relay."""
        return (TUNNEL_CAPABILITY,) if self._address is not None else ()

    def offered(self, session: Session) -> bool:
        """Whether ``session`` may open tunnels: the relay is on and its edge listed the capability."""
        return self._address is not None and TUNNEL_CAPABILITY in session.capabilities

    def attach(self, session: Session) -> SessionTunnels:
        """The tunnels of ``session``; end them (:meth:`detach`) when it ends."""
        down = self._bytes

        async def send_frame(frame: bytes) -> None:
            if not await session.send_frame(frame, "tunnel_data", own=True):
                raise LinkClosed("the session ended")
            down["down"] = down["down"] + len(frame) - HEADER_BYTES

        async def send_message(msg: TunnelClose | TunnelCredit) -> None:
            if not await session.send(msg, own=True):
                raise LinkClosed("the session ended")

        return SessionTunnels(session, Tunnels(send_frame, send_message))

    def detach(self, tunnels: SessionTunnels, reason: str) -> None:
        tunnels.tunnels.end(reason)

    async def open(self, tunnels: SessionTunnels, msg: TunnelOpen, log: Log) -> None:
        """Serve the tunnel ``msg`` opens until either end closes it (run it as a task of the session)."""
        session, mux = tunnels.session, tunnels.tunnels
        if self._address is None:  # pragma: no cover - offered() is checked first
            return
        if msg.stream in mux:
            await self._refuse(session, msg.stream, f"tunnel {msg.stream} is already open", "refused")
            return
        if len(mux) >= self._max_tunnels:
            text = f"too many tunnels: a node may hold {self._max_tunnels} at once (apiRelay.maxTunnelsPerNode)"
            await self._refuse(session, msg.stream, text, "refused")
            return
        stream = mux.add(msg.stream)
        try:
            with anyio.fail_after(self._connect_timeout):
                api = await anyio.connect_tcp(self._address.host, self._address.port)
        except (OSError, TimeoutError) as exc:
            reason, outcome = _connect_failure(exc)
            self._metrics.tunnels_opened.labels(outcome=outcome).inc()
            log.warning("tunnel_not_connected", stream=msg.stream, outcome=outcome, error=reason)
            await mux.cut(stream, reason)
            return
        self._metrics.tunnels_opened.labels(outcome="opened").inc()
        self._metrics.tunnels.inc()
        try:
            async with api:
                if await session.send(TunnelOpened(stream=msg.stream), own=True):
                    await self._relay(stream, api)
        finally:
            self._metrics.tunnels.dec()
            await stream.aclose()

    async def _relay(self, stream: TunnelStream, api: anyio.abc.SocketStream) -> None:
        counts = self._bytes
        async with anyio.create_task_group() as tg:

            async def up() -> None:
                try:
                    while True:
                        data = await stream.receive(MAX_PAYLOAD * 4)
                        await api.send(data)
                        counts["up"] = counts["up"] + len(data)
                except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    pass
                tg.cancel_scope.cancel()

            async def down() -> None:
                try:
                    while True:
                        await stream.send(await api.receive(MAX_PAYLOAD))
                except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    pass
                tg.cancel_scope.cancel()

            tg.start_soon(up)
            tg.start_soon(down)

    async def _refuse(self, session: Session, number: int, reason: str, outcome: str) -> None:
        self._metrics.tunnels_opened.labels(outcome=outcome).inc()
        await session.send(TunnelClose(stream=number, reason=reason), own=True)
