"""One HTTP/1.1 connection of the server (h11 over a trio stream): its requests read, handled and answered.

Keep-alive, whole bodies in memory within the server's bounds (``max_body_bytes`` each, 413 beyond;
what :class:`Bodies` allows at once across connections, 503 beyond), the header and idle timeouts,
streamed responses that end with the peer, and a handler that raises answering 500: whatever one
connection does ends only that connection. The server that accepts connections is
:mod:`roles.common.httpserver`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Final

import h11
import structlog
import trio

from roles.common.http_messages import Handler, Request, Response

__all__ = ["RECEIVE_CHUNK", "Bodies", "Limits", "phrase", "serve_connection"]

Log = structlog.typing.FilteringBoundLogger

RECEIVE_CHUNK: Final = 64 << 10
"""Bytes read from a connection at once."""


@dataclass(slots=True)
class Bodies:
    """Request bodies held at once across the server's connections, from their first byte until answered."""

    limit: float
    held: int = 0


@dataclass(frozen=True, slots=True)
class Limits:
    """What the server allows each of its connections: body size, timeouts, the bodies held at once."""

    max_body_bytes: int
    idle_timeout: float
    header_timeout: float
    bodies: Bodies
    on_error: Callable[[], object]


@dataclass(slots=True)
class _Hold:
    """The body bytes one request holds of the server's :class:`Bodies`."""

    bodies: Bodies
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


class _Reject(Exception):
    """Answer ``response`` and close the connection: the request could not be read."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status)
        self.response = response


async def serve_connection(stream: trio.abc.Stream, *, handler: Handler, limits: Limits, log: Log) -> None:
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
    stream: trio.abc.Stream, *, handler: Handler, limits: Limits, log: Log, first_head_by: float
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
    limits: Limits,
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
        conn.receive_data(bytes(await stream.receive_some(RECEIVE_CHUNK)))


async def _receive_request(
    stream: trio.abc.Stream, conn: h11.Connection, limits: Limits, hold: _Hold, *, head_by: float
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


def _too_large(limits: Limits) -> Response:
    return Response.text(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request body exceeds {limits.max_body_bytes} bytes")


def _busy(limits: Limits) -> Response:
    return Response.text(
        HTTPStatus.SERVICE_UNAVAILABLE,
        f"the server holds its limit of {limits.bodies.limit:.0f} bytes of request bodies at once; try again",
        headers=(("retry-after", "1"),),
    )


async def _send(
    stream: trio.abc.Stream, conn: h11.Connection, response: Response, *, close: bool, head: bool, limits: Limits
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
    data = conn.send(h11.Response(status_code=response.status, headers=headers, reason=phrase(response.status))) or b""
    if response.body and not head:
        data += conn.send(h11.Data(data=response.body)) or b""
    data += conn.send(h11.EndOfMessage()) or b""
    with trio.fail_after(limits.idle_timeout):
        await stream.send_all(data)


async def _stream(
    stream: trio.abc.Stream, conn: h11.Connection, response: Response, *, head: bool, limits: Limits, log: Log
) -> None:
    """Send a streamed response; the connection is to be closed after it, however it ended."""
    # No content-length: h11 sends the body chunked (close-delimited to an HTTP/1.0 peer).
    headers = [("content-type", response.content_type), *response.headers, ("connection", "close")]
    with trio.fail_after(limits.idle_timeout):
        await stream.send_all(
            conn.send(h11.Response(status_code=response.status, headers=headers, reason=phrase(response.status))) or b""
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
            while await stream.receive_some(RECEIVE_CHUNK):
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


def _peer(stream: trio.abc.Stream) -> str:
    transport = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    if isinstance(transport, trio.SocketStream):
        try:
            host, port, *_ = transport.socket.getpeername()
        except OSError:
            return "?"
        return f"{host}:{port}"
    return "?"


def phrase(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""
