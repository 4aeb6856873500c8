"""Who is at the other end of a connection to the local API: the user owning the client's socket.

On loopback every client has the address 127.0.0.1, so a cap per address would be one cap for all.
What tells local clients apart is who runs them: the kernel records the user that created each
socket, and Linux's socket diagnostics (``NETLINK_SOCK_DIAG``, what ``ss -e`` reads) find the
client's end of a connection by its two addresses and say whose it is, without privileges and
without reading the whole socket table. A client is then "uid N", and one user's programs can hold
only their share of the local API's connections, however many they open.

Where the owner cannot be learnt (not Linux, or the client already gone) the client is its address,
which every such connection shares. Standard library only.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from typing import Final

__all__ = ["client_name", "socket_owner"]

_NETLINK_SOCK_DIAG: Final = 4
_SOCK_DIAG_BY_FAMILY: Final = 20
_NLM_F_REQUEST: Final = 1
_NLMSG_ERROR: Final = 2
_NO_COOKIE: Final = 0xFFFFFFFF
_ALL_STATES: Final = 0xFFFFFFFF
_HEADER: Final = struct.Struct("=IHHII")
"""``nlmsghdr``: length, type, flags, sequence, port id."""
_REQUEST: Final = struct.Struct("=BBBBI2s2s16s16sIII")
"""``inet_diag_req_v2``: family, protocol, extensions, pad, states, then ``inet_diag_sockid``: source
and destination ports and addresses (network order), interface, cookie (two halves)."""
_UID_AT: Final = _HEADER.size + 4 + 48 + 12
"""Where ``inet_diag_msg.idiag_uid`` is in an answer: after the header, four bytes, the socket id and
expires, receive and send queues."""
_TIMEOUT_S: Final = 1.0
"""The kernel answers at once; this only bounds a call that somehow would not return."""


def socket_owner(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The user id owning the IPv4 TCP socket bound to ``local`` and connected to ``remote``, or None.

    None when there is no such socket (any more), the address is not IPv4, or the system has no
    socket diagnostics.
    """
    try:
        source, destination = socket.inet_aton(local[0]), socket.inet_aton(remote[0])
        family = socket.AF_NETLINK  # absent where there is no netlink
    except (OSError, AttributeError):
        return None
    request = _REQUEST.pack(
        socket.AF_INET,
        socket.IPPROTO_TCP,
        0,
        0,
        _ALL_STATES,
        struct.pack("!H", local[1]),
        struct.pack("!H", remote[1]),
        source.ljust(16, b"\0"),
        destination.ljust(16, b"\0"),
        0,
        _NO_COOKIE,
        _NO_COOKIE,
    )
    message = _HEADER.pack(_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0) + request
    try:
        with contextlib.closing(socket.socket(family, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)) as diag:
            diag.settimeout(_TIMEOUT_S)
            diag.sendto(message, (0, 0))
            answer = diag.recv(4096)
    except OSError:
        return None
    if len(answer) < _UID_AT + 4 or _HEADER.unpack_from(answer)[1] == _NLMSG_ERROR:
        return None  # ENOENT above all: the client closed before it was looked up
    uid: int = struct.unpack_from("=I", answer, _UID_AT)[0]
    return uid


def client_name(local: tuple[str, int], remote: tuple[str, int]) -> str:
    """The client at ``remote`` of a connection accepted at ``local``, as its per-client places count it."""
    owner = socket_owner(remote, local)
    return f"uid {owner}" if owner is not None else f"{remote[0]} (owner unknown)"
