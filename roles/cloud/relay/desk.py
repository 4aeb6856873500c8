"""What a hub's session hands the relay: tunnels' bytes and messages, and requests for the node's certificate.

One :class:`SessionRelay` per session (:meth:`RelayDesk.attach`) answers the session's reader for the
relay's part of the protocol, and says what to refuse (an Error frame's code and text) instead of
sending anything itself: the session's reader owns its replies.
"""

from __future__ import annotations

from typing import Final, final

import structlog
import trio

from nodetask import messages
from nodetask.messages import NodeCredentialsRequest, TunnelClose, TunnelCredit, TunnelOpen
from roles.cloud.relay.api_relay import ApiRelay, SessionTunnels
from roles.cloud.relay.node_credentials import NodeCredentialIssuer
from roles.cloud.sessions import Session

__all__ = ["RelayDesk", "RelayMessage", "SessionRelay"]

Log = structlog.typing.FilteringBoundLogger

RelayMessage = TunnelOpen | TunnelCredit | TunnelClose | NodeCredentialsRequest
Refusal = tuple[str, str]
"""An Error frame's code and text."""

NO_TUNNELS: Final = (
    "unexpected",
    f"both ends must list {messages.TUNNEL_CAPABILITY} (and the hub relay, apiRelay.enabled) for tunnels",
)

NO_CERTIFICATES: Final = (
    "unexpected",
    f"both ends must list {messages.NODE_CREDENTIALS_CAPABILITY} (and the hub issue them,"
    " apiRelay.nodeCertificates) for node certificates",
)


@final
class SessionRelay:
    """The relay's part of one session."""

    def __init__(self, session: Session, tunnels: SessionTunnels | None, desk: RelayDesk) -> None:
        self._session = session
        self._tunnels = tunnels
        self._desk = desk

    def data(self, frame: bytes) -> Refusal | None:
        """A tunnel's bytes, handed to their tunnel without waiting (a stalled tunnel is its own problem)."""
        if self._tunnels is None:
            return NO_TUNNELS
        if problem := self._tunnels.tunnels.data(frame):
            return "bad_tunnel_data", problem
        return None

    def message(self, msg: RelayMessage, tasks: trio.Nursery, log: Log) -> Refusal | None:
        """A tunnel's message or a request for the node's certificate; what waits runs in ``tasks`` (the
        session's), so that nothing holds up its frames."""
        if isinstance(msg, NodeCredentialsRequest):
            issuer = self._desk.issuer
            if not issuer.offered(self._session):
                return NO_CERTIFICATES
            tasks.start_soon(issuer.issue, self._session, msg, log.bind(request=msg.id))
        elif self._tunnels is None:
            return NO_TUNNELS
        elif isinstance(msg, TunnelOpen):
            tasks.start_soon(self._desk.relay.open, self._tunnels, msg, log.bind(stream=msg.stream))
        elif isinstance(msg, TunnelCredit):
            self._tunnels.tunnels.credit(msg)
        else:
            self._tunnels.tunnels.close(msg)
        return None

    def detach(self, reason: str) -> None:
        """The session ended: its tunnels break with ``reason``."""
        if self._tunnels is not None:
            self._desk.relay.detach(self._tunnels, reason)


@final
class RelayDesk:
    """The hub's relay (tunnels to the API server) and certificate issuer, as its sessions meet them."""

    def __init__(self, relay: ApiRelay, issuer: NodeCredentialIssuer) -> None:
        self.relay = relay
        self.issuer = issuer

    @property
    def capabilities(self) -> tuple[str, ...]:
        """What the hub lists in its Welcome for them."""
        return (*self.relay.capabilities, *self.issuer.capabilities)

    def attach(self, session: Session) -> SessionRelay:
        return SessionRelay(session, self.relay.attach(session) if self.relay.offered(session) else None, self)
