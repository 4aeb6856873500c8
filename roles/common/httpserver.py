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

It needs only the base install (an edge device serves its local API with it); the health and
metrics routes, which need Prometheus' client, are in :mod:`roles.common.health`.

Usage::

    handler = router([*health_routes(ready=lambda: synced.is_set(), registry=registry), *other_routes])
    port = await tg.start(functools.partial(serve_http, handler, host="127.0.0.1", port=0, log=log))
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Final, NoReturn

import anyio
import anyio.abc
import h11
import structlog
import trio

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
_RECEIVE_CHUNK: Final = 64 << 10
_UNLIMITED: Final = 1 << 62
_TELL_REFUSED_S: Final = 0.5


@dataclass(frozen=True, slots=True)
class Request:
    """One complete request; header names are lower-case, in the order received."""

    method: str
    path: str
    query: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        name = name.lower()
        return next((v for k, v in self.headers if k == name), None)


Send = Callable[[bytes], Awaitable[None]]
"""Sends one piece of a streamed body; raises if the peer is gone or takes longer than the idle timeout."""


@dataclass(frozen=True, slots=True)
class Response:
    """A response; ``content-length`` and ``content-type`` are added when sent.

    With ``stream``, the body is not ``body`` but what ``stream(send)`` sends, piece by piece (chunked),
    until it returns: a watch. ``stream`` is cancelled if the peer closes its end, and the connection
    always ends with such a response, so a long stream never holds up a request queued behind it.
    """

    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()
    stream: Callable[[Send], Awaitable[None]] | None = None

    @classmethod
    def text(cls, status: int, text: str, *, headers: tuple[tuple[str, str], ...] = ()) -> Response:
        """A plain-text response; a final newline is added for people using curl."""
        return cls(status=status, body=f"{text}\n".encode(), headers=headers)

    @classmethod
    def json(cls, status: int, body: bytes) -> Response:
        """A response with an already-encoded JSON body."""
        return cls(status=status, body=body, content_type="application/json")

    @classmethod
    def streamed(cls, status: int, stream: Callable[[Send], Awaitable[None]], *, content_type: str) -> Response:
        """A response whose body ``stream`` sends as it is produced."""
        return cls(status=status, content_type=content_type, stream=stream)


Handler = Callable[[Request], Awaitable[Response]]
PeerKey = Callable[[trio.SocketStream], str]
"""Names the peer a connection's per-peer places are counted under (by default, its address)."""
Refused = Callable[[Refusal, str], Response]
"""The response a plain-HTTP connection refused at accept gets, given the cap it met and its peer."""


@dataclass(frozen=True, slots=True)
class HttpRoute:
    """``handler`` answers ``method`` on ``path``, or on every path under it with ``prefix``."""

    method: str
    path: str
    handler: Handler
    prefix: bool = False

    def matches(self, path: str) -> bool:
        return path == self.path or (self.prefix and path.startswith(self.path))


def router(routes: Iterable[HttpRoute]) -> Handler:
    """A handler that dispatches to ``routes``: 404 for an unknown path, 405 (with Allow) for a known
    path asked with another method. An exact path wins over a prefix, a longer prefix over a shorter.
    """
    table = sorted(routes, key=lambda r: (r.prefix, -len(r.path)))

    async def route(request: Request) -> Response:
        matching = [r for r in table if r.matches(request.path)]
        if not matching:
            return Response.text(HTTPStatus.NOT_FOUND, f"no such path: {request.path}")
        # Only routes as specific as the best match count: a prefix route's other methods must not
        # shadow a 405 on a more specific path.
        best = [r for r in matching if (r.prefix, r.path) == (matching[0].prefix, matching[0].path)]
        for r in best:
            if r.method == request.method:
                return await r.handler(request)
        allowed = ", ".join(sorted({r.method for r in best}))
        return Response.text(
            HTTPStatus.METHOD_NOT_ALLOWED, f"{request.method} is not allowed here", headers=(("allow", allowed),)
        )

    return route


# ---------------------------------------------------------------------------------------------- server


@dataclass(slots=True)
class _Bodies:
    """Request bodies held at once across the server's connections, from their first byte until answered."""

    limit: float
    held: int = 0


@dataclass(frozen=True, slots=True)
class _Limits:
    max_body_bytes: int
    idle_timeout: float
    header_timeout: float
    bodies: _Bodies
    on_error: Callable[[], object]


@dataclass(slots=True)
class _Hold:
    """The body bytes one request holds of the server's :class:`_Bodies`."""

    bodies: _Bodies
    held: int = 0

    def take(self, size: int) -> bool:
        if self.bodies.held + size > self.bodies.limit:
            return False
        self.bodies.held += size
        self.held += size
        return True

    def release(self) -> None:
        self.bodies.held -= self.held
        self.held = 0


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


class _Reject(Exception):
    """Answer ``response`` and close the connection: the request could not be read."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status)
        self.response = response


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
    limits = _Limits(
        max_body_bytes=max_body_bytes,
        idle_timeout=idle_timeout,
        header_timeout=header_timeout,
        bodies=_Bodies(limit=math.inf if max_buffered_bytes is None else max_buffered_bytes),
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


def _peer(stream: trio.abc.Stream) -> str:
    transport = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    if isinstance(transport, trio.SocketStream):
        try:
            host, port, *_ = transport.socket.getpeername()
        except OSError:
            return "?"
        return f"{host}:{port}"
    return "?"


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
    limits: _Limits,
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
        await _serve_connection(served, handler=handler, limits=limits, log=log)
    finally:
        connections.places.give(peer)


async def _tell_refused(stream: trio.SocketStream, response: Response) -> None:
    """Send ``response`` on a connection refused at accept, then end it, within half a second.

    What the peer sent is read and dropped until it closes its end: closed with its request unread,
    the connection would be reset, and a reset can discard the response before the peer reads it.
    """
    head = [f"HTTP/1.1 {int(response.status)} {_phrase(response.status).decode()}"]
    head += [f"content-type: {response.content_type}", f"content-length: {len(response.body)}"]
    head += [f"{name}: {value}" for name, value in response.headers]
    head.append("connection: close")
    data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + response.body
    with trio.move_on_after(_TELL_REFUSED_S):
        try:
            await stream.send_all(data)
            await stream.send_eof()
            while await stream.receive_some(_RECEIVE_CHUNK):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


async def _serve_connection(stream: trio.abc.Stream, *, handler: Handler, limits: _Limits, log: Log) -> None:
    log = log.bind(peer=_peer(stream))
    # The handshake and the first request's head share one deadline: a peer that connects and says
    # nothing is gone after the header timeout, however it spreads out what little it sends.
    first_head_by = trio.current_time() + limits.header_timeout
    try:
        if isinstance(stream, trio.SSLStream):
            with trio.fail_at(first_head_by):
                await stream.do_handshake()
        await _serve_requests(stream, handler=handler, limits=limits, log=log, first_head_by=first_head_by)
    except trio.TooSlowError:
        log.debug("http_connection_timed_out")
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        # Includes failed TLS handshakes (the SSLError is the cause): only this connection ends.
        log.debug("http_connection_broken", error=repr(exc.__cause__ or exc))
    except Exception:
        # Supervision boundary: a bug in one connection must never take the listener down.
        limits.on_error()
        log.exception("http_connection_failed")
    finally:
        with trio.move_on_after(1):
            await stream.aclose()


async def _serve_requests(
    stream: trio.abc.Stream, *, handler: Handler, limits: _Limits, log: Log, first_head_by: float
) -> None:
    conn = h11.Connection(h11.SERVER)
    head_by = first_head_by
    while True:
        hold = _Hold(limits.bodies)
        try:
            if not await _serve_one(stream, conn, hold, handler=handler, limits=limits, log=log, head_by=head_by):
                return
        finally:
            hold.release()
        head_by = math.inf  # later requests: the idle timeout alone
        conn.start_next_cycle()


async def _serve_one(
    stream: trio.abc.Stream,
    conn: h11.Connection,
    hold: _Hold,
    *,
    handler: Handler,
    limits: _Limits,
    log: Log,
    head_by: float,
) -> bool:
    """Receive, handle and answer one request; whether the connection may carry another."""
    try:
        with trio.fail_after(limits.idle_timeout):
            request = await _receive_request(stream, conn, limits, hold, head_by=head_by)
    except _Reject as reject:
        await _send(stream, conn, reject.response, close=True, head=False, limits=limits)
        log.info("http_request_rejected", status=int(reject.response.status))
        return False
    except trio.TooSlowError:
        # A request under way gets told; a connection idle between requests is just closed.
        if conn.their_state is h11.SEND_BODY:
            await _send(
                stream,
                conn,
                Response.text(HTTPStatus.REQUEST_TIMEOUT, "request timed out"),
                close=True,
                head=False,
                limits=limits,
            )
        raise
    if request is None:
        return False
    started = trio.current_time()
    try:
        response = await handler(request)
    except Exception:
        limits.on_error()
        log.exception("http_handler_failed", method=request.method, path=request.path)
        response = Response.text(HTTPStatus.INTERNAL_SERVER_ERROR, "internal server error")
    streamed = response.stream is not None
    head = request.method == "HEAD"
    if streamed:
        await _stream(stream, conn, response, head=head, limits=limits, log=log)
    else:
        await _send(stream, conn, response, close=False, head=head, limits=limits)
    log.debug(
        "http_request",
        method=request.method,
        path=request.path,
        status=int(response.status),
        duration_s=round(trio.current_time() - started, 4),
    )
    return not streamed and conn.our_state is not h11.MUST_CLOSE


async def _next_event(stream: trio.abc.Stream, conn: h11.Connection) -> h11.Event:
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise _Reject(Response.text(exc.error_status_hint, f"malformed request: {exc}")) from None
        if isinstance(event, h11.Event):
            return event
        if event is h11.PAUSED:
            # Only possible if a cycle were left unfinished, which _serve_requests never does.
            raise _Reject(Response.text(HTTPStatus.BAD_REQUEST, "unexpected pipelined request"))
        # b"" (end of stream) tells h11 the peer closed; it answers ConnectionClosed or an error.
        conn.receive_data(bytes(await stream.receive_some(_RECEIVE_CHUNK)))


async def _receive_request(
    stream: trio.abc.Stream, conn: h11.Connection, limits: _Limits, hold: _Hold, *, head_by: float
) -> Request | None:
    """The next whole request, its body held in ``hold``; None when the peer closed the connection between requests.

    Its head must be in by ``head_by`` (the clock of :func:`trio.current_time`).
    """
    with trio.fail_at(head_by):
        event = await _next_event(stream, conn)
    if isinstance(event, h11.ConnectionClosed):
        return None
    if not isinstance(event, h11.Request):
        raise _Reject(Response.text(HTTPStatus.BAD_REQUEST, "expected a request"))
    headers = tuple((k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in event.headers)
    length = next((v for k, v in headers if k == "content-length"), None)
    # h11 has already checked that a content-length is a valid number.
    if length is not None and int(length) > limits.max_body_bytes:
        raise _Reject(_too_large(limits))
    # A body announced is held whole before its first byte is read: refused now, it costs nothing.
    if length is not None and not hold.take(int(length)):
        raise _Reject(_busy(limits))
    if conn.they_are_waiting_for_100_continue:
        await stream.send_all(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
    body = bytearray()
    while True:
        part = await _next_event(stream, conn)
        if isinstance(part, h11.Data):
            body += part.data
            if len(body) > limits.max_body_bytes:  # chunked bodies have no length up front
                raise _Reject(_too_large(limits))
            if len(body) > hold.held and not hold.take(len(body) - hold.held):
                raise _Reject(_busy(limits))
        elif isinstance(part, h11.EndOfMessage):
            break
        else:
            raise _Reject(Response.text(HTTPStatus.BAD_REQUEST, "incomplete request body"))
    target = event.target.decode("ascii", errors="replace")
    path, _, query = target.partition("?")
    return Request(method=event.method.decode("ascii"), path=path, query=query, headers=headers, body=bytes(body))


def _too_large(limits: _Limits) -> Response:
    return Response.text(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request body exceeds {limits.max_body_bytes} bytes")


def _busy(limits: _Limits) -> Response:
    return Response.text(
        HTTPStatus.SERVICE_UNAVAILABLE,
        f"the server holds its limit of {limits.bodies.limit:.0f} bytes of request bodies at once; try again",
        headers=(("retry-after", "1"),),
    )


async def _send(
    stream: trio.abc.Stream, conn: h11.Connection, response: Response, *, close: bool, head: bool, limits: _Limits
) -> None:
    if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return  # a response is already under way or the connection is done: nothing left to say
    headers = [
        ("content-type", response.content_type),
        ("content-length", str(len(response.body))),
        *response.headers,
    ]
    if close:
        # Tells h11 (and the peer) that this connection ends here: the request may be unread.
        headers.append(("connection", "close"))
    data = conn.send(h11.Response(status_code=response.status, headers=headers, reason=_phrase(response.status))) or b""
    if response.body and not head:
        data += conn.send(h11.Data(data=response.body)) or b""
    data += conn.send(h11.EndOfMessage()) or b""
    with trio.fail_after(limits.idle_timeout):
        await stream.send_all(data)


async def _stream(
    stream: trio.abc.Stream, conn: h11.Connection, response: Response, *, head: bool, limits: _Limits, log: Log
) -> None:
    """Send a streamed response; the connection is to be closed after it, however it ended."""
    # No content-length: h11 sends the body chunked (close-delimited to an HTTP/1.0 peer).
    headers = [("content-type", response.content_type), *response.headers, ("connection", "close")]
    with trio.fail_after(limits.idle_timeout):
        await stream.send_all(
            conn.send(h11.Response(status_code=response.status, headers=headers, reason=_phrase(response.status)))
            or b""
        )

    async def send(piece: bytes) -> None:
        if piece:  # an empty chunk would end a chunked body
            with trio.fail_after(limits.idle_timeout):
                await stream.send_all(conn.send(h11.Data(data=piece)) or b"")

    peer_left = False

    async def notice_peer_leaving(done: trio.CancelScope) -> None:
        # A client sends nothing more during a stream; its end of file (or a reset) ends the stream.
        nonlocal peer_left
        try:
            while await stream.receive_some(_RECEIVE_CHUNK):
                pass
        except trio.BrokenResourceError:
            pass
        peer_left = True
        done.cancel()

    if response.stream is not None and not head:
        # Errors are kept and raised outside the nursery, which would otherwise wrap them in a group.
        broken: trio.BrokenResourceError | trio.TooSlowError | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(notice_peer_leaving, nursery.cancel_scope)
            try:
                await response.stream(send)
            except (trio.BrokenResourceError, trio.TooSlowError) as exc:
                broken = exc
            except Exception:
                # The head is out: all that is left to do is to end the body short, which the client sees.
                limits.on_error()
                log.exception("http_stream_failed")
                peer_left = True
            finally:
                nursery.cancel_scope.cancel()
        if broken is not None:
            raise broken
        if peer_left:
            return
    with trio.fail_after(limits.idle_timeout):
        await stream.send_all(conn.send(h11.EndOfMessage()) or b"")


def _phrase(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""
