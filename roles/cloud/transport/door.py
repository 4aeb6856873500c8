"""The hub's front door for edges: TCP, TLS and the websocket handshake, up to an authenticated link.

Each TCP connection takes a handshake place (when none is free, accepting waits a moment for one,
then refuses at once, before any TLS or websocket work); its TLS and websocket handshake must be
done within ``handshake_timeout``. Then
the node named in the path is checked before anything else (it goes into API paths and Secret
names), then the edge's bearer token; the handshake place is traded for a session place, and the
accepted websocket is handed, as a :class:`~nodetask.link.Link`, to the session handler.

No error raised while serving one connection ends the hub: :meth:`WebSocketDoor._connection` is
the supervision boundary, which logs it, counts it and closes only that connection.
"""

from __future__ import annotations

import errno
import functools
from collections.abc import Callable, Coroutine
from http import HTTPStatus
from typing import Any, Final

import anyio
import anyio.abc
import structlog
import trio

from nodetask.link import LinkClosed
from nodetask.names import clip, object_name_problem
from roles.cloud.metrics import HubMetrics
from roles.cloud.settings import HubSettings
from roles.cloud.transport.auth import AuthError, TokenBook, bearer_token
from roles.cloud.transport.ingress import Admission, LogThrottle, connection_limits, fd_limit, warn_throttled
from roles.cloud.transport.listeners import open_listeners
from roles.cloud.transport.session_handler import ServeEdge
from roles.cloud.transport.wire import Wire
from roles.cloud.transport.ws_server import ServerWebSocket, UpgradeRequest, read_upgrade
from roles.common.server_tls import ServerTls, connection_context
from roles.common.slots import Slots

__all__ = ["EDGE_PATH_PREFIX", "WebSocketDoor"]

Log = structlog.typing.FilteringBoundLogger

EDGE_PATH_PREFIX: Final = "/nodes/"

HANDSHAKE_QUEUE_S: Final = 1.0
"""How long the accept loop waits for a handshake place before it refuses connections again."""
ACCEPT_RETRY_S: Final = 0.1
"""The pause after accept failed for want of descriptors or memory."""
_ACCEPT_CAPACITY_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})

_BUSY_TEXT: Final = b"this hub is at its limit of handshakes (maxHandshakes)\n"
_BUSY: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n"
    b"retry-after: 5\r\nconnection: close\r\n\r\n%s" % (len(_BUSY_TEXT), _BUSY_TEXT)
)


class WebSocketDoor:
    """Accepts edge websockets and serves each authenticated one; run with :meth:`serve`."""

    def __init__(
        self, *, settings: HubSettings, tokens: TokenBook, metrics: HubMetrics, throttle: LogThrottle, log: Log
    ) -> None:
        self._settings = settings
        self._tokens = tokens
        self._metrics = metrics
        self._throttle = throttle
        self._log = log
        fds = fd_limit()
        derived = connection_limits(fds)
        self._handshakes = Slots(settings.max_handshakes or derived.handshakes)
        self._session_places = Slots(settings.max_sessions or derived.sessions)
        metrics.handshakes.set_function(lambda: self._handshakes.used)
        log.info(
            "connection_limits",
            max_handshakes=self._handshakes.total,
            max_sessions=self._session_places.total,
            fd_limit=fds,
        )

    async def serve(
        self,
        serve_edge: ServeEdge,
        *,
        host: str,
        port: int,
        ssl_context: ServerTls | None,
        task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on ``host:port`` and serve edges with ``serve_edge`` until cancelled; ready with the bound port.

        ``ssl_context`` may be a function (:mod:`roles.common.server_tls`): each connection's TLS handshake
        takes the context it returns then, so a reloaded certificate reaches new connections only.
        """
        listeners = await open_listeners(host, port)
        bound: int = listeners[0].socket.getsockname()[1]
        handler = functools.partial(self._connection, serve_edge=serve_edge, ssl_context=ssl_context)
        async with anyio.create_task_group() as tg:
            for listener in listeners:
                tg.start_soon(self._accept, listener, handler, tg)
            task_status.started(bound)

    async def _accept(
        self,
        listener: trio.SocketListener,
        handler: Callable[[trio.SocketStream, Admission], Coroutine[Any, Any, None]],
        connections: anyio.abc.TaskGroup,
    ) -> None:
        """Accept connections and serve each in ``connections``. One that finds every handshake place
        taken waits up to :data:`HANDSHAKE_QUEUE_S` for one before it is refused.

        A reconnect storm frees places within milliseconds: its edges wait (in the kernel's accept
        queues, and one per listener here) in arrival order, instead of being refused and coming back
        on their own timers, which cost a refused attempt each and left places empty between retries.
        Places that stay taken for longer (silent or slow peers) mean refusing at once again, until a
        connection finds a place free.
        """
        queueing = True
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _ACCEPT_CAPACITY_ERRNOS:
                        raise
                    # Out of descriptors or memory: the connections being served will give some back.
                    warn_throttled(self._throttle, self._log, "edge_accept_failed", error=errno.errorcode[exc.errno])
                    await anyio.sleep(ACCEPT_RETRY_S)
                    continue
                admission = Admission(handshakes=self._handshakes, sessions=self._session_places)
                if not admission.enter() and queueing:
                    with anyio.move_on_after(HANDSHAKE_QUEUE_S):
                        while not admission.enter():
                            await self._handshakes.wait_free()
                queueing = admission.holding
                connections.start_soon(handler, stream, admission)

    async def _connection(
        self,
        stream: trio.SocketStream,
        admission: Admission,
        *,
        serve_edge: ServeEdge,
        ssl_context: ServerTls | None,
    ) -> None:
        """One edge connection, from accept to close: the hub's per-connection supervision boundary."""
        if not admission.holding:
            await self._refuse_connection(stream, tls=ssl_context is not None)
            return
        wire = Wire.take(stream)
        try:
            opened = await self._open(wire, ssl_context, admission)
            if opened is not None:
                await serve_edge(*opened)
        except* Exception:
            # The one place a hub catches every error (C12): a bug met while serving one edge must
            # end that edge's connection, never the process and every other edge's session with it.
            # (except*: a cancellation arriving at the same time still propagates.)
            self._metrics.connection_errors.labels(transport="websocket").inc()
            self._log.exception("edge_connection_failed", peer=wire.peer())
        finally:
            admission.leave()
            wire.close()

    async def _open(
        self, wire: Wire, ssl_context: ServerTls | None, admission: Admission
    ) -> tuple[str, ServerWebSocket] | None:
        """The edge's node and its accepted websocket; None if it went or was refused.

        Its own call, so that the request (and the HTTP parser under it) is freed once answered.
        """
        request = await self._upgrade(wire, ssl_context)
        return None if request is None else await self._admit(request, admission)

    async def _upgrade(self, wire: Wire, ssl_context: ServerTls | None) -> UpgradeRequest | None:
        """The edge's websocket request, once its TLS and HTTP handshake are done; None if they fail or stall."""
        with anyio.move_on_after(self._settings.handshake_timeout):
            if ssl_context is not None:
                try:
                    await wire.start_tls(connection_context(ssl_context))
                except OSError as exc:  # a failed TLS handshake (ssl.SSLError) or a peer that went
                    self._log.debug("edge_handshake_failed", peer=wire.peer(), error=repr(exc))
                    return None
            return await read_upgrade(wire, max_message_bytes=self._settings.max_frame_bytes)
        self._metrics.handshake_timeouts.inc()
        seconds = self._settings.handshake_timeout
        warn_throttled(self._throttle, self._log, "edge_handshake_timed_out", peer=wire.peer(), seconds=seconds)
        return None

    async def _refuse_connection(self, stream: trio.SocketStream, *, tls: bool) -> None:
        """Close a connection beyond ``maxHandshakes`` before any TLS or websocket work."""
        self._metrics.connections_refused.labels(limit="maxHandshakes").inc()
        warn_throttled(
            self._throttle,
            self._log,
            "edge_connection_refused",
            peer=_peer(stream),
            limit="maxHandshakes",
            max_handshakes=self._handshakes.total,
        )
        try:
            if not tls:
                # Plain HTTP can still say why; a TLS client learns it from its retry.
                with anyio.move_on_after(0.5):
                    await stream.send_all(_BUSY)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            with anyio.CancelScope(shield=True):
                await stream.aclose()

    async def _refuse(self, request: UpgradeRequest, status: int, reason: str, node: str) -> None:
        self._metrics.auth_failures.labels(status=str(int(status))).inc()
        warn_throttled(self._throttle, self._log, "edge_refused", node=clip(node, 64), status=int(status), error=reason)
        await request.reject(status, reason.encode())

    async def _admit(self, request: UpgradeRequest, admission: Admission) -> tuple[str, ServerWebSocket] | None:
        path = request.path.split("?", 1)[0]
        if not path.startswith(EDGE_PATH_PREFIX):
            await self._refuse(request, HTTPStatus.NOT_FOUND, f"expected the path {EDGE_PATH_PREFIX}<node>", "")
            return None
        # Checked before anything else: the name goes into API paths and Secret names.
        node = path[len(EDGE_PATH_PREFIX) :]
        problem = object_name_problem(node)
        if problem:
            await self._refuse(request, HTTPStatus.BAD_REQUEST, f"node name {clip(node)!r} {problem}", node)
            return None
        try:
            await self._tokens.check(node, bearer_token(request.headers))
        except AuthError as exc:
            await self._refuse(request, exc.status, str(exc), node)
            return None
        if not admission.promote():
            self._metrics.connections_refused.labels(limit="maxSessions").inc()
            reason = f"this hub holds its limit of {self._session_places.total} sessions (maxSessions)"
            await self._refuse(request, HTTPStatus.SERVICE_UNAVAILABLE, reason, node)
            return None
        try:
            return node, await request.accept()
        except LinkClosed:
            return None


def _peer(stream: trio.SocketStream) -> str:
    try:
        host, port, *_ = stream.socket.getpeername()
    except OSError:
        return "?"
    return f"{host}:{port}"
