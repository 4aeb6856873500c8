"""A small HTTP/1.1 server (h11 over trio streams) for the roles' webhooks, health, metrics and local API.

The endpoints behind it are few, small and called by the API server, kubelets, Prometheus and
local clients, so this is deliberately minimal: whole request bodies in memory (bounded),
keep-alive, no HTTP/2, and streamed responses (``Response.stream``, for watches).
What it does take care of is the part that keeps a daemon alive: a malformed request gets 400, an
oversized body 413, a body past what the server holds at once 503, a connection that has not sent
its first request's head within the header timeout is closed, and so is one silent for the idle
timeout, a failed TLS handshake ends only its own connection, a handler that raises answers 500 and
is logged, never crashing the server, and connections beyond ``max_connections`` in all or
``max_connections_per_peer`` from one peer (its address, unless ``peer_key`` says otherwise) are
closed as soon as they are accepted (the places are :mod:`roles.common.slots`', as the hub's front door
counts its own), on plain HTTP with a response saying why when the server gives one.

This module accepts connections and keeps their places; what one connection does is
:mod:`roles.common.http_connection`, and the messages and router handlers deal in are
:mod:`roles.common.http_messages`. It is the face the roles import all of it from (``__all__``).
It needs only the base install (an edge device serves its local API with it); the health and
metrics routes, which need Prometheus' client, are in :mod:`roles.common.health`.

Usage::

    handler = router([*health_routes(ready=lambda: synced.is_set(), registry=registry), *other_routes])
    port = await tg.start(functools.partial(serve_http, handler, host="127.0.0.1", port=0, log=log))
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, NoReturn

import anyio
import anyio.abc
import structlog
import trio

from roles.common.http_connection import RECEIVE_CHUNK, Bodies, Limits, phrase, serve_connection
from roles.common.http_messages import Handler, HttpRoute, Request, Response, Send, router
from roles.common.server_tls import ServerTls, connection_context
from roles.common.slots import PeerSlots, Refusal, Slots

__all__ = [
    "DEFAULT_HEADER_TIMEOUT",
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_MAX_BODY_BYTES",
    "Handler",
    "HttpRoute",
    "PeerKey",
    "Refused",
    "Request",
    "Response",
    "Send",
    "router",
    "serve_http",
]

Log = structlog.typing.FilteringBoundLogger

DEFAULT_MAX_BODY_BYTES: Final = 3 << 20
"""An AdmissionReview carries the object twice (object, oldObject); 3 MiB is etcd's object limit
(1.5 MiB) with room to spare."""
DEFAULT_IDLE_TIMEOUT: Final = 30.0
"""Seconds a connection may take to hand over a whole request (or to sit idle between requests),
and to take a response."""
DEFAULT_HEADER_TIMEOUT: Final = 10.0
"""Seconds a new connection has for its TLS handshake and its first request's head: a connection
that sends nothing holds a place (and some 40 KiB with TLS) for this long, not the idle timeout."""
_UNLIMITED: Final = 1 << 62
_TELL_REFUSED_S: Final = 0.5

PeerKey = Callable[[trio.SocketStream], str]
"""Names the peer a connection's per-peer places are counted under (by default, its address)."""
Refused = Callable[[Refusal, str], Response]
"""The response a plain-HTTP connection refused at accept gets, given the cap it met and its peer."""


@dataclass(frozen=True, slots=True)
class _Connections:
    places: PeerSlots
    peer_key: PeerKey
    refused: Refused | None
    telling: Slots
    """Refused connections told why at once: as many as there are places, since each holds a descriptor
    while it is told (for half a second at most); more are closed without a word."""
    on_refused: Callable[[], object]
    on_refused_per_peer: Callable[[], object]


async def serve_http(
    handler: Handler,
    *,
    host: str,
    port: int,
    log: Log,
    ssl_context: ServerTls | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_buffered_bytes: int | None = None,
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    max_connections: int | None = None,
    max_connections_per_peer: int | None = None,
    peer_key: PeerKey | None = None,
    refused: Refused | None = None,
    on_error: Callable[[], object] = lambda: None,
    on_refused: Callable[[], object] = lambda: None,
    on_refused_per_peer: Callable[[], object] = lambda: None,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Serve ``handler`` on ``host``:``port`` (HTTPS with ``ssl_context``) until cancelled.

    ``ssl_context`` may be a function, asked for the context of each connection as it is accepted:
    a certificate reloaded when rotated (:mod:`roles.common.cert_reload`) reaches new connections, and the
    open ones keep the one they started with.

    Reports the bound port through ``task_status`` once listening, so ``port=0`` picks a free one;
    give ``host`` as a single address then (a name that resolves to several addresses binds each to
    its own free port, and only the first is reported).

    At most ``max_connections`` connections are served at once, and at most
    ``max_connections_per_peer`` from one peer (None: no limit); one more is closed as soon as it
    is accepted, before any TLS work, and ``on_refused`` (or ``on_refused_per_peer``) is called.
    A peer is its address, or what ``peer_key`` names it (the local API: the user owning the client's
    socket, since on loopback all share one address). On plain HTTP, ``refused`` gives the response
    a refused connection gets first (so that it names the cap, and the setting that raises it).
    A connection has ``header_timeout`` seconds from accept for its TLS handshake and its first
    request's head, then ``idle_timeout`` for each whole request and between requests.
    Request bodies are at most ``max_body_bytes`` each (413 beyond) and ``max_buffered_bytes`` in all
    at once, counted until each is answered (None: no limit; a body that would pass it gets 503).
    ``on_error`` is called for each connection or handler that failed with an unexpected error.

    Cancellation: cancelling the caller's scope closes the listeners and every connection.
    Errors: only binding errors (:class:`OSError`) escape; per-connection failures are logged.
    """
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound_port: int = listeners[0].socket.getsockname()[1]
    log = log.bind(host=host, port=bound_port, tls=ssl_context is not None)
    limits = Limits(
        max_body_bytes=max_body_bytes,
        idle_timeout=idle_timeout,
        header_timeout=header_timeout,
        bodies=Bodies(limit=math.inf if max_buffered_bytes is None else max_buffered_bytes),
        on_error=on_error,
    )
    connections = _Connections(
        places=PeerSlots(
            total=_UNLIMITED if max_connections is None else max_connections,
            per_peer=_UNLIMITED if max_connections_per_peer is None else max_connections_per_peer,
        ),
        peer_key=_peer_address if peer_key is None else peer_key,
        refused=None if ssl_context is not None else refused,
        telling=Slots(_UNLIMITED if max_connections is None else max_connections),
        on_refused=on_refused,
        on_refused_per_peer=on_refused_per_peer,
    )
    serve = functools.partial(
        _admit, ssl_context=ssl_context, handler=handler, limits=limits, log=log, connections=connections
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, serve, listeners)
        log.info("http_listening")
        task_status.started(bound_port)
    raise AssertionError("trio.serve_listeners returned")  # pragma: no cover - it never does


def _peer_address(stream: trio.SocketStream) -> str:
    """The address a connection came from, which its per-peer places are counted under."""
    try:
        host: str = stream.socket.getpeername()[0]
    except (OSError, IndexError):
        return "?"  # already gone: it shares one count with others like it, and ends at once anyway
    return host


async def _admit(
    stream: trio.SocketStream,
    *,
    ssl_context: ServerTls | None,
    handler: Handler,
    limits: Limits,
    log: Log,
    connections: _Connections,
) -> None:
    peer = connections.peer_key(stream)
    refused = connections.places.take(peer)
    if refused is not None:
        (connections.on_refused if refused == "total" else connections.on_refused_per_peer)()
        if connections.refused is not None and connections.telling.take():
            try:
                await _tell_refused(stream, connections.refused(refused, peer))
            finally:
                connections.telling.give()
        await stream.aclose()
        return
    try:
        # Spec-compliant TLS mode: closing sends close_notify, which strict clients (Python's ssl)
        # require; a peer that closes without one only breaks its own, finished, connection.
        if ssl_context is None:
            served: trio.abc.Stream = stream
        else:
            served = trio.SSLStream(stream, connection_context(ssl_context), server_side=True)
        await serve_connection(served, handler=handler, limits=limits, log=log)
    finally:
        connections.places.give(peer)


async def _tell_refused(stream: trio.SocketStream, response: Response) -> None:
    """Send ``response`` on a connection refused at accept, then end it, within half a second.

    What the peer sent is read and dropped until it closes its end: closed with its request unread,
    the connection would be reset, and a reset can discard the response before the peer reads it.
    """
    head = [f"HTTP/1.1 {int(response.status)} {phrase(response.status).decode()}"]
    head += [f"content-type: {response.content_type}", f"content-length: {len(response.body)}"]
    head += [f"{name}: {value}" for name, value in response.headers]
    head.append("connection: close")
    data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + response.body
    with trio.move_on_after(_TELL_REFUSED_S):
        try:
            await stream.send_all(data)
            await stream.send_eof()
            while await stream.receive_some(RECEIVE_CHUNK):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
