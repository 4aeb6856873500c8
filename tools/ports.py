"""Loopback TCP ports for the servers that tests, benchmarks and the demo start.

Best is a server that binds port 0 and says which port it got: nothing can take that port between a
choice and a bind. The hub does (its ``portsFile``, read with :func:`reported`). Any other server
gets a port picked in advance (:func:`free_ports`), and there is a window between the pick and its
bind. A port of the kernel's ephemeral range could meanwhile become the local port of any outgoing
loopback connection (a registry push, an API call), and the server then failed with EADDRINUSE
(the demo's hub once did, half a minute after its port was chosen); below that range only an
explicit bind takes a port, so the picks are made there.

A server stopped and started again on its port (a hub brought back, which its edges look for where
it was) leaves the same window while it is down: :func:`held` keeps the port bound, refusing
connections as a stopped server does, until the server is back.

Standard library only: ``tools/provision`` imports it before (or without) the project's virtualenv.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Final

__all__ = ["LOOPBACK", "ephemeral_floor", "free_port", "free_ports", "held", "reported"]

LOOPBACK: Final = "127.0.0.1"
LOWEST_PICKED: Final = 10_000
"""Picks stay above the ports well-known services use."""
_DEFAULT_EPHEMERAL_FLOOR: Final = 32_768


def ephemeral_floor() -> int:
    """The lowest port the kernel hands out by itself (to ``connect()`` and to a bind of port 0)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL_FLOOR


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback TCP ports free right now, below the kernel's ephemeral range.

    For a server that cannot bind port 0 and report what it got. The sockets that try the
    candidates stay open together, so no port comes twice in one call: ask for all the ports
    one start needs in one call. Errors: :class:`RuntimeError` when too few are free.
    """
    floor = ephemeral_floor()
    lowest = LOWEST_PICKED if floor > LOWEST_PICKED else 1024
    span = range(lowest, max(floor, lowest + 1))
    candidates = random.sample(span, min(len(span), 4 * count + 64))
    ports: list[int] = []
    with contextlib.ExitStack() as stack:
        for port in candidates:
            probe = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                probe.bind((LOOPBACK, port))
            except OSError:
                continue
            ports.append(port)
            if len(ports) == count:
                return ports
    raise RuntimeError(f"found only {len(ports)} of {count} free loopback ports between {lowest} and {floor}")


def free_port() -> int:
    """One port of :func:`free_ports`."""
    return free_ports(1)[0]


@contextlib.contextmanager
def held(port: int = 0) -> Iterator[int]:
    """Keep loopback ``port`` (0: a free one) bound, not listening, while the block lasts; yields the port.

    Connections to it are refused, as by a stopped server, and neither an outgoing connection nor
    another bind of port 0 can take it. A server that sets ``SO_REUSEADDR`` (trio's listeners and
    the hub's do) can bind it meanwhile: start the server inside the block, end the block once it
    listens. Errors: :class:`OSError` (``EADDRINUSE``) when something else holds the port.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as placeholder:
        placeholder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        placeholder.bind((LOOPBACK, port))
        bound: int = placeholder.getsockname()[1]
        yield bound


def reported(path: Path, *, pid: int) -> dict[str, int] | None:
    """The ports that process ``pid`` wrote it listens on, by setting (``{"listen": 43121, ...}``).

    None while ``path`` is missing, unreadable or another process's (one that ran before). The file
    is a JSON object of ``pid`` and ``"host:port"`` strings by setting, as the hub writes its
    ``portsFile`` (:mod:`roles.common.ports_file`).
    """
    try:
        content = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(content, dict) or content.get("pid") != pid:
        return None
    ports: dict[str, int] = {}
    for key, value in content.items():
        if key != "pid" and isinstance(value, str):
            _, _, port = value.rpartition(":")
            if port.isdigit():
                ports[key] = int(port)
    return ports
