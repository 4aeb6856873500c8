"""The real :class:`~nodetask.link.Link`: a trio-websocket client connection.

trio-websocket's errors stay here: a failed handshake and a closed connection both become
:class:`~nodetask.link.LinkClosed`, so the agent handles one kind of lost link.

The TCP connection and, for ``wss://``, the TLS handshake are made here, and the stream handed to
trio-websocket for the websocket handshake: trio-websocket's own connect swallows a failed TLS
handshake and waits out its whole connect timeout (60 s) before saying only ``ConnectionTimeout``
(python-trio/trio-websocket#199), so a hub whose certificate the CA does not verify looked like a hub
that did not answer. Now it fails at once, with the verifier's reason.
"""

from __future__ import annotations

import ssl
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Final, final

import trio
import trio_websocket

from nodetask.link import NORMAL_CLOSE, Frame, Link, LinkClosed

__all__ = ["open_ws_link"]


def _closed(exc: Exception, *, timeout: float | None = None) -> LinkClosed:
    """``exc`` as a closed link; a TooSlowError says which ``timeout`` ran out."""
    if isinstance(exc, trio.TooSlowError) and timeout is not None:
        return LinkClosed(f"no websocket within {timeout:g} s")
    # Handshake errors often carry no text of their own, only their cause (the OSError).
    detail = str(exc) or str(exc.__cause__ or "") or type(exc).__name__
    return LinkClosed(detail)


@final
@dataclass(eq=False, slots=True)
class _WebSocketLink:
    ws: trio_websocket.WebSocketConnection
    _heard: float = field(default_factory=trio.current_time, init=False)

    async def send(self, frame: bytes) -> None:
        try:
            await self.ws.send_message(frame)
        except trio_websocket.ConnectionClosed as exc:
            raise _closed(exc) from None

    async def receive(self) -> Frame:
        try:
            frame = await self.ws.get_message()
        except trio_websocket.ConnectionClosed as exc:
            raise _closed(exc) from None
        self._heard = trio.current_time()
        return frame

    async def ping(self) -> None:
        try:
            await self.ws.ping()
        except trio_websocket.ConnectionClosed as exc:
            raise _closed(exc) from None
        self._heard = trio.current_time()

    def heard_at(self) -> float:
        return self._heard

    async def close(self, code: int = NORMAL_CLOSE, reason: str = "") -> None:
        await self.ws.aclose(code, reason)


CONNECT_TIMEOUT_S: Final = 60.0
"""For the TCP, TLS and websocket handshakes together, unless the caller says (trio-websocket's own default)."""
DISCONNECT_TIMEOUT_S: Final = 60.0
"""For the closing handshake, as trio-websocket's."""


@dataclass(frozen=True, slots=True)
class _Target:
    host: str
    port: int
    resource: str
    host_header: str


def _target(url: str, ssl_context: ssl.SSLContext | None) -> _Target:
    """Where ``url`` points, as trio-websocket reads a URL. Errors: ValueError naming what is wrong."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("ws", "wss"):
        raise ValueError(f"{url!r} is not a ws:// or wss:// URL")
    if (parts.scheme == "wss") != (ssl_context is not None):
        raise ValueError(f"{url!r}: a TLS context goes with wss:// and only with it")
    if not parts.hostname:
        raise ValueError(f"{url!r} names no host")
    port = parts.port or (443 if ssl_context is not None else 80)
    resource = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host_header = parts.hostname if port in (80, 443) else f"{parts.hostname}:{port}"
    return _Target(parts.hostname, port, resource, host_header)


async def _stream(
    target: _Target, ssl_context: ssl.SSLContext | None
) -> trio.SocketStream | trio.SSLStream[trio.SocketStream]:
    """A connected stream to ``target``, its TLS handshake done when ``ssl_context`` is given."""
    if ssl_context is None:
        return await trio.open_tcp_stream(target.host, target.port)
    stream = await trio.open_ssl_over_tcp_stream(
        target.host, target.port, ssl_context=ssl_context, https_compatible=True
    )
    try:
        await stream.do_handshake()
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return stream


def _leaf(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one exception a nursery wrapped, if it wrapped one alone."""
    if len(group.exceptions) == 1 and not isinstance(group.exceptions[0], BaseExceptionGroup):
        return group.exceptions[0]
    return None


@asynccontextmanager
async def open_ws_link(
    url: str,
    *,
    headers: Sequence[tuple[bytes, bytes]],
    ssl_context: ssl.SSLContext | None,
    handshake_timeout: float = CONNECT_TIMEOUT_S,
) -> AsyncIterator[Link]:
    """A websocket to ``url`` (``ws://`` or ``wss://`` with ``ssl_context``), closed when the block ends; a
    :class:`LinkClosed` when its handshakes take longer than ``handshake_timeout`` seconds together.

    What the block raises reaches the caller as raised (not wrapped by the connection's own task group).
    """
    target = _target(url, ssl_context)
    deadline = trio.current_time() + handshake_timeout
    try:
        with trio.fail_at(deadline):
            stream = await _stream(target, ssl_context)
    except (OSError, trio.BrokenResourceError, trio.TooSlowError) as exc:
        raise _closed(exc, timeout=handshake_timeout) from exc
    try:
        async with trio.open_nursery() as nursery:
            try:
                with trio.fail_at(deadline):
                    ws = await trio_websocket.wrap_client_stream(
                        nursery, stream, target.host_header, target.resource, extra_headers=list(headers)
                    )
            except (trio_websocket.HandshakeError, trio_websocket.ConnectionClosed, trio.TooSlowError, OSError) as exc:
                nursery.cancel_scope.cancel()
                raise _closed(exc, timeout=handshake_timeout) from exc
            try:
                yield _WebSocketLink(ws)
            finally:
                with trio.move_on_after(DISCONNECT_TIMEOUT_S):
                    await ws.aclose()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        leaf = _leaf(group)
        if leaf is None:
            raise
        if isinstance(leaf, (trio_websocket.HandshakeError, trio_websocket.ConnectionClosed)):
            # The hub's refusal (ConnectionRejected) is raised by the connection's reader task.
            raise _closed(leaf) from leaf
        raise leaf from leaf.__cause__  # keeps its own cause, drops the group
    finally:
        await trio.aclose_forcefully(stream)  # a no-op once the websocket closed it
