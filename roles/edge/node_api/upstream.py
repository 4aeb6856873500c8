"""Requests to the API server, as the node: HTTP/1.1 in TLS with the node's client certificate, in tunnels.

The TLS is the device's own, end to end with the API server: the hub relaying the tunnel sees
ciphertext, and the API server sees the node's certificate (``system:node:<node>``), so its Node
authorizer and NodeRestriction decide what the device may do. The server's certificate is checked
against the cluster's CA under the name the device was given at join, not whatever the hub says.

Connections are kept for the next request (a TLS handshake through the hub costs round trips a
request should not pay), at most ``max_idle`` at once, and only within the hub session that carried
them: a new session starts afresh. A reused connection that turns out closed before any answer is
replaced once by a new one.
"""

from __future__ import annotations

import contextlib
import functools
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, final

import anyio
import anyio.abc
import h11
from anyio.streams.tls import TLSStream

from roles.edge.node_api.tunnel_client import Offline, TunnelClient

__all__ = ["ApiResponse", "NodeTls", "NodeTlsSource", "Upstream"]

RECEIVE: Final = 65536
MAX_IDLE: Final = 8
HANDSHAKE_TIMEOUT_S: Final = 15.0
HEAD_TIMEOUT_S: Final = 60.0
"""Longest the API server may take to start answering a request that is not a watch."""


@dataclass(frozen=True, slots=True)
class NodeTls:
    """How the device speaks TLS to the API server: its node's client certificate and the cluster's CA."""

    context: ssl.SSLContext
    server_name: str
    """The name the API server's certificate must carry (the device was given it at join)."""


NodeTlsSource = Callable[[], NodeTls | None]
"""The node's TLS as it is now (credentials are issued, and renewed, while the agent runs); None: none yet."""


@final
@dataclass(eq=False, slots=True)
class _Connection:
    stream: TLSStream
    http: h11.Connection
    session: int
    server_name: str


@final
@dataclass(eq=False)
class ApiResponse:
    """The head of an answer; its body is read with :meth:`chunks` or :meth:`read`, then it is :meth:`close`d."""

    status: int
    headers: list[tuple[str, str]]
    _connection: _Connection
    _upstream: Upstream
    _done: bool = field(default=False, init=False)

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k == name), None)

    async def chunks(self, *, idle_timeout: float | None = None) -> AsyncIterator[bytes]:
        """The body as it arrives (a watch's events as the API server sends them)."""
        connection = self._connection
        while True:
            with anyio.fail_after(idle_timeout):
                event = await _next_event(connection)
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self._done = True
                return
            else:
                raise anyio.BrokenResourceError("the API server's answer ended early")

    async def read(self, limit: int) -> bytes:
        """The whole body. Errors: ``BrokenResourceError`` past ``limit`` bytes or when it ends early."""
        body = bytearray()
        async for chunk in self.chunks(idle_timeout=HEAD_TIMEOUT_S):
            body += chunk
            if len(body) > limit:
                raise anyio.BrokenResourceError(f"the API server's answer exceeds {limit} bytes")
        return bytes(body)

    async def close(self) -> None:
        """Give the connection back for another request when the answer was read whole, else close it."""
        await self._upstream.release(self._connection, reusable=self._done)


async def _next_event(connection: _Connection) -> h11.Event:
    http = connection.http
    while True:
        event = http.next_event()
        if event is h11.NEED_DATA:
            try:
                data = await connection.stream.receive(RECEIVE)
            except anyio.EndOfStream:
                data = b""
            except (anyio.BrokenResourceError, ssl.SSLError, OSError) as exc:
                raise anyio.BrokenResourceError(f"the connection to the API server broke: {exc}") from None
            http.receive_data(data)
            continue
        if event is h11.PAUSED:  # pragma: no cover - one request per cycle
            raise anyio.BrokenResourceError("unexpected pause")
        assert isinstance(event, h11.Event)
        return event


@final
class Upstream:
    """Sends requests to the API server as the node, through ``tunnels``."""

    def __init__(self, tunnels: TunnelClient, tls: NodeTlsSource, *, max_idle: int = MAX_IDLE) -> None:
        self._tunnels = tunnels
        self._tls = tls
        self._max_idle = max_idle
        self._idle: list[_Connection] = []
        self.connections = 0
        """TLS connections made (a metric: reuse keeps it low)."""

    async def request(
        self, method: str, target: str, headers: Sequence[tuple[str, str]], body: bytes, *, head_timeout: float | None
    ) -> ApiResponse:
        """Send one request and return the head of its answer (``head_timeout``: None for a watch).

        Errors: :class:`Offline` when no tunnel can be had or the API server cannot be spoken to.
        """
        exchange = functools.partial(
            self._exchange, method=method, target=target, headers=headers, body=body, head_timeout=head_timeout
        )
        idle = self._take()
        if idle is not None:
            try:
                return await exchange(idle)
            except anyio.BrokenResourceError:
                # Closed by the API server while it was idle: it fails before any answer, and the
                # request is sent once more on a new connection.
                await _close(idle)
        connection = await self._connect()
        try:
            return await exchange(connection)
        except anyio.BrokenResourceError as exc:
            await _close(connection)
            raise Offline(str(exc)) from None

    async def _exchange(
        self,
        connection: _Connection,
        *,
        method: str,
        target: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
        head_timeout: float | None,
    ) -> ApiResponse:
        http = connection.http
        out = [(k, v) for k, v in headers]
        out.append(("host", connection.server_name))
        if body or method in ("POST", "PUT", "PATCH"):
            out.append(("content-length", str(len(body))))
        data = http.send(h11.Request(method=method, target=target, headers=out)) or b""
        if body:
            data += http.send(h11.Data(data=body)) or b""
        data += http.send(h11.EndOfMessage()) or b""
        try:
            await connection.stream.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, ssl.SSLError, OSError) as exc:
            raise anyio.BrokenResourceError(f"the connection to the API server broke: {exc}") from None
        while True:
            try:
                with anyio.fail_after(head_timeout):
                    event = await _next_event(connection)
            except TimeoutError:
                raise anyio.BrokenResourceError(f"the API server did not answer within {head_timeout:g} s") from None
            if isinstance(event, h11.Response):
                headers_in = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in event.headers]
                return ApiResponse(event.status_code, headers_in, connection, self)
            if isinstance(event, h11.InformationalResponse):
                continue
            raise anyio.BrokenResourceError("the API server closed the connection before answering")

    async def _connect(self) -> _Connection:
        # The source may read the credential files (a stat each time, the files when they changed): in a thread.
        tls = await anyio.to_thread.run_sync(self._tls)
        if tls is None:
            raise Offline("the node has no credentials for the API server yet (nodeApi.credentialsDir)")
        session = self._tunnels.sessions
        tunnel = await self._tunnels.open()
        try:
            with anyio.fail_after(HANDSHAKE_TIMEOUT_S):
                stream = await TLSStream.wrap(
                    tunnel,
                    server_side=False,
                    hostname=tls.server_name,
                    ssl_context=tls.context,
                    standard_compatible=False,
                )
        except (TimeoutError, ssl.SSLError, anyio.BrokenResourceError, anyio.EndOfStream, OSError) as exc:
            await tunnel.aclose()
            raise Offline(f"TLS with the API server failed: {str(exc) or type(exc).__name__}") from None
        self.connections += 1
        return _Connection(stream, h11.Connection(h11.CLIENT), session, tls.server_name)

    def _take(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()
            if connection.session == self._tunnels.sessions and self._tunnels.online:
                return connection
            # Otherwise its tunnel broke with its session: there is no one to tell, only memory to free.
        return None

    async def release(self, connection: _Connection, *, reusable: bool) -> None:
        http = connection.http
        if (
            reusable
            and http.our_state is h11.DONE
            and http.their_state is h11.DONE
            and connection.session == self._tunnels.sessions
            and len(self._idle) < self._max_idle
        ):
            http.start_next_cycle()
            self._idle.append(connection)
            return
        await _close(connection)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            await _close(connection)


async def _close(connection: _Connection) -> None:
    with (
        anyio.CancelScope(shield=True),
        anyio.move_on_after(1),
        contextlib.suppress(anyio.BrokenResourceError, ssl.SSLError, OSError),
    ):
        await connection.stream.aclose()
