"""The ``httpServer`` processor: POST the request data to a server and take its answer as the results.

KubeDiag's contract: the body is a JSON object of strings; a 200 whose body is a JSON object of
strings is success and that object becomes the results; any other status is failure, and so is a
200 with anything else. Errors of the transport (refused, reset, a name that does not resolve, a
peer that closes without answering) are retried with backoff until the operation's timeout is
near; the answer itself is never retried. A body over :data:`MAX_BODY_BYTES` fails the run, and no
more of it is read.

Unlike KubeDiag: certificates are verified against the system's trust store (KubeDiag turns
verification off), a host other than the device itself is refused unless the device's config lists
it in ``diagnosis.httpHosts``, and the device itself only at the ports ``diagnosis.loopbackPorts``
lists, never at the agent's own (:mod:`.reach`). A listed name that turns out to resolve to the
device is caught on the connection's peer address, before a byte is sent.

A small HTTP/1.1 client written with h11 over anyio sockets, which the base install already has
(the server side is :mod:`roles.common.httpserver`): one request per connection, no redirects, no proxy.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import anyio
import anyio.abc
import anyio.streams.tls
import h11
import msgspec

from nodetask.backoff import Backoff
from nodetask.names import clip
from roles.edge.processors.env import Log
from roles.edge.processors.outcome import REASON_CHARS, ProcessorOutcome, failed
from roles.edge.processors.reach import Reach, address_refusal, host_refusal
from schemas.processors import HTTPServer

__all__ = ["DEVICE_ADDRESS", "MAX_BODY_BYTES", "Target", "run_http", "target_of", "verdict"]

DEVICE_ADDRESS: Final = "127.0.0.1"
"""Where an ``httpServer`` without ``address`` is: the device itself (KubeDiag: the node's agent)."""
MAX_BODY_BYTES: Final = 2 << 20
"""KubeDiag's ``MaxDataSize`` (a gRPC message's default limit)."""
_PORTS: Final = {"http": 80, "https": 443}
_RECEIVE_CHUNK: Final = 64 << 10
_RETRY_INITIAL: Final = 0.2
_RETRY_CAP: Final = 5.0
_USER_AGENT: Final = "nodetaskd-diagnosis"

_ENCODER: Final = msgspec.json.Encoder()
_RESULTS: Final = msgspec.json.Decoder(dict[str, str])


class _TransportError(Exception):
    """The exchange broke before an answer was complete: worth another attempt."""


class _Refused(Exception):
    """The exchange cannot succeed by trying again (a bad certificate, a malformed or oversized answer)."""


@dataclass(frozen=True, slots=True)
class Target:
    """Where an ``httpServer`` processor posts to."""

    host: str
    port: int
    path: str
    tls: bool

    @property
    def url(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{shown}:{self.port}{self.path}"


def target_of(server: HTTPServer) -> Target:
    """Where ``server`` is: absent address is the device, absent port the scheme's.

    Errors: ValueError naming the field.
    """
    scheme = server.scheme.lower()
    if scheme not in _PORTS:
        raise ValueError(f"httpServer.scheme {server.scheme!r} is not http or https")
    return Target(
        host=(server.address or DEVICE_ADDRESS).strip("[]"),
        port=server.port if server.port is not None else _PORTS[scheme],
        path=server.path if server.path.startswith("/") else f"/{server.path}",
        tls=scheme == "https",
    )


def verdict(url: str, status: int, body: bytes) -> ProcessorOutcome:
    """What an answer means: success with its object of strings for a 200 that has one, failure otherwise."""
    if status != 200:
        text = body.decode("utf-8", errors="replace").strip()
        return failed(f"POST {url} answered {status}: {clip(text, REASON_CHARS) or '(no body)'}")
    try:
        results = _RESULTS.decode(body)
    except msgspec.ValidationError as exc:
        return failed(f"POST {url} answered 200 with JSON that is not an object of strings: {exc}")
    except msgspec.DecodeError as exc:
        return failed(f"POST {url} answered 200 with a body that is not JSON: {exc}")
    return ProcessorOutcome(succeeded=True, results=results)


async def run_http(
    server: HTTPServer,
    request: Mapping[str, str],
    reach: Reach,
    *,
    deadline: float,
    log: Log,
) -> ProcessorOutcome:
    """POST ``request`` to ``server`` if ``reach`` allows it; retry transport errors with backoff while
    ``deadline`` (loop time) allows.

    Cancellation: the caller's scope (the operation's timeout) ends the attempt under way.
    """
    try:
        target = target_of(server)
    except ValueError as exc:
        return failed(str(exc))
    url = target.url
    if (why := host_refusal(target.host, target.port, reach)) is not None:
        return failed(f"POST {url} refused: {why}")
    body = _ENCODER.encode(dict(request))
    backoff = Backoff(initial=_RETRY_INITIAL, cap=_RETRY_CAP)
    attempts = 0
    while True:
        attempts += 1
        try:
            status, answer = await _post(target, body, reach)
        except _Refused as exc:
            return failed(f"POST {url}: {exc}")
        except _TransportError as exc:
            delay = backoff.delay()
            if anyio.current_time() + delay >= deadline:
                noun = "attempt" if attempts == 1 else "attempts"
                return failed(f"POST {url}: {exc} ({attempts} {noun} within timeoutSeconds)")
            log.info("diagnosis_http_retry", url=url, attempt=attempts, error=str(exc), delay_s=round(delay, 3))
            await anyio.sleep(delay)
            continue
        return verdict(url, status, answer)


async def _connect(target: Target, reach: Reach) -> anyio.abc.ByteStream:
    try:
        stream: anyio.abc.ByteStream = await anyio.connect_tcp(target.host, target.port)
    except OSError as exc:
        raise _TransportError(_describe(exc)) from None
    try:
        # A listed name may resolve to the device: judged on the address actually connected to,
        # which no later answer of the resolver can change, before anything is sent.
        peer = str(stream.extra(anyio.abc.SocketAttribute.remote_address)[0])
        if (why := address_refusal(target.host, peer, target.port, reach)) is not None:
            raise _Refused(f"refused: {why}")
        if target.tls:
            # Answers are framed by h11 (length or chunks), so a peer closing without close_notify is fine.
            stream = await anyio.streams.tls.TLSStream.wrap(
                stream, hostname=target.host, ssl_context=ssl.create_default_context(), standard_compatible=False
            )
    except BaseException:
        with anyio.CancelScope(shield=True):
            await anyio.aclose_forcefully(stream)
        raise
    return stream


async def _handshaken(target: Target, reach: Reach) -> anyio.abc.ByteStream:
    """A connection to ``target`` that ``reach`` allows, TLS done when asked for."""
    try:
        return await _connect(target, reach)
    except ssl.SSLCertVerificationError as exc:
        raise _Refused(f"TLS certificate verification failed: {exc.verify_message or exc}") from None
    except anyio.EndOfStream:
        raise _TransportError("the server closed the connection during the TLS handshake") from None
    except (OSError, anyio.BrokenResourceError) as exc:
        cause = exc.__cause__
        if isinstance(cause, ssl.SSLCertVerificationError):
            raise _Refused(f"TLS certificate verification failed: {cause.verify_message or cause}") from None
        raise _TransportError(_describe(exc)) from None


def _describe(exc: BaseException) -> str:
    # anyio wraps the errors of every address it tried in one OSError: say what they were.
    if isinstance(exc.__cause__, OSError):
        return _describe(exc.__cause__)
    if isinstance(exc.__cause__, BaseExceptionGroup):
        return "; ".join(sorted({_describe(e) for e in exc.__cause__.exceptions}))
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


async def _post(target: Target, body: bytes, reach: Reach) -> tuple[int, bytes]:
    """One exchange on a fresh connection: the answer's status and body."""
    conn = h11.Connection(h11.CLIENT)
    authority = f"[{target.host}]" if ":" in target.host else target.host
    try:
        head = h11.Request(
            method="POST",
            target=target.path,
            headers=[
                ("host", f"{authority}:{target.port}"),
                ("user-agent", _USER_AGENT),
                ("content-type", "application/json"),
                ("accept", "application/json"),
                ("content-length", str(len(body))),
                ("connection", "close"),
            ],
        )
    except h11.LocalProtocolError as exc:
        raise _Refused(f"httpServer.path {target.path!r} cannot be sent: {exc}") from None
    stream = await _handshaken(target, reach)
    async with stream:
        try:
            await stream.send((conn.send(head) or b"") + (conn.send(h11.Data(data=body)) or b""))
            await stream.send(conn.send(h11.EndOfMessage()) or b"")
            return await _receive(stream, conn)
        except (OSError, anyio.BrokenResourceError) as exc:
            raise _TransportError(_describe(exc)) from None


async def _receive(stream: anyio.abc.ByteStream, conn: h11.Connection) -> tuple[int, bytes]:
    status: int | None = None
    answer = bytearray()
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            if status is None:
                # Closed or garbled before any status line: as good as a reset connection.
                raise _TransportError(f"no answer: {exc}") from None
            raise _Refused(f"the answer broke off: {exc}") from None
        if event is h11.NEED_DATA:
            try:
                data = await stream.receive(_RECEIVE_CHUNK)
            except anyio.EndOfStream:
                data = b""
            conn.receive_data(data)
        elif isinstance(event, h11.Response):
            status = event.status_code
            length = next((int(v) for k, v in event.headers if k == b"content-length"), None)
            if length is not None and length > MAX_BODY_BYTES:
                raise _Refused(f"the answer's body ({length} bytes) exceeds {MAX_BODY_BYTES} bytes")
        elif isinstance(event, h11.Data):
            answer += event.data
            if len(answer) > MAX_BODY_BYTES:
                raise _Refused(f"the answer's body exceeds {MAX_BODY_BYTES} bytes")
        elif isinstance(event, h11.EndOfMessage):
            assert status is not None  # h11 sends a Response before any body
            return status, bytes(answer)
        elif isinstance(event, h11.ConnectionClosed):
            raise _TransportError("the server closed the connection without answering")
        # InformationalResponse (100 Continue and the like): wait for the real one.
