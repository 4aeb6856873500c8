"""The hub's listening sockets for edges: several accept queues on one port.

The kernel keeps the connections a listening socket has not accepted yet in one queue of at most
``net.core.somaxconn`` (4,096 on current Linux); past that it drops the connection's handshake and
the edge's TCP stack tries again 1, 3, 7, 15 and 31 s later. A fleet reconnecting to a restarted hub
arrives faster than the hub completes handshakes, so one queue overflowed at 19,000 edges and their
return took as long as TCP's retry timers. With ``SO_REUSEPORT``, :data:`ACCEPT_QUEUES` sockets share
the port, each with a queue of its own, and the kernel spreads new connections over them; no
setting of the host changes.

A socket sharing a port that way would also share it with another process of the same user that
did the same (a second hub started by mistake). So the port is first bound once without
``SO_REUSEPORT``: a port anything else holds fails with ``EADDRINUSE``, as a single socket would.
"""

from __future__ import annotations

import socket
from typing import Final

import trio

__all__ = ["ACCEPT_QUEUES", "open_listeners"]

ACCEPT_QUEUES: Final = 8
"""Listening sockets per address where the system has ``SO_REUSEPORT``; one otherwise."""
_BACKLOG: Final = 0xFFFF
"""Asked of listen(); the kernel caps it at net.core.somaxconn."""


async def open_listeners(host: str, port: int, *, queues: int = ACCEPT_QUEUES) -> list[trio.SocketListener]:
    """Listeners on every address ``host`` resolves to (all of them for ``""``), ``queues`` per address.

    Port 0 picks a free port, the same for the sockets of one address. Errors: :class:`OSError`
    (``EADDRINUSE``: something holds the port).
    """
    if not hasattr(socket, "SO_REUSEPORT"):
        queues = 1
    addresses = await trio.socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    listeners: list[trio.SocketListener] = []
    try:
        for family, kind, proto, _, address in addresses:
            chosen = await _free_port(family, kind, proto, address) if queues > 1 else address[1]
            bound = (address[0], chosen, *address[2:])
            for _ in range(queues):  # one at a time: those made are closed if one fails
                sock = await _listening(family, kind, proto, bound, shared=queues > 1)
                listeners.append(trio.SocketListener(sock))
    except BaseException:
        for listener in listeners:
            listener.socket.close()
        raise
    return listeners


async def _free_port(family: int, kind: int, proto: int, address: tuple[object, ...]) -> int:
    """Bind ``address`` once without sharing: raises EADDRINUSE if anything holds it; the port it got."""
    with trio.socket.socket(family, kind, proto) as probe:
        _options(probe, family, shared=False)
        await probe.bind(address)
        port: int = probe.getsockname()[1]
        return port


async def _listening(
    family: int, kind: int, proto: int, address: tuple[object, ...], *, shared: bool
) -> trio.socket.SocketType:
    sock = trio.socket.socket(family, kind, proto)
    try:
        _options(sock, family, shared=shared)
        await sock.bind(address)
        sock.listen(_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def _options(sock: trio.socket.SocketType, family: int, *, shared: bool) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
