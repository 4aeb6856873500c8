"""The hub's edge port is several accept queues on one port, and a port held by anything else is refused."""

from __future__ import annotations

import errno
import socket

import pytest
import trio

from roles.cloud.transport.listeners import ACCEPT_QUEUES, open_listeners

LOOPBACK = "127.0.0.1"


async def test_the_edge_port_is_served_by_several_accept_queues_that_all_take_connections() -> None:
    """ACCEPT_QUEUES sockets share one port and the kernel hands new connections to more than one of them."""
    listeners = await open_listeners(LOOPBACK, 0)
    ports = {listener.socket.getsockname()[1] for listener in listeners}
    assert len(listeners) == ACCEPT_QUEUES
    assert len(ports) == 1
    (port,) = ports
    clients = [await trio.open_tcp_stream(LOOPBACK, port) for _ in range(64)]
    served = [0] * len(listeners)
    for index, listener in enumerate(listeners):
        while True:
            with trio.move_on_after(0.05):  # connected means queued already: only an empty queue waits
                accepted = await listener.accept()
                await accepted.aclose()
                served[index] += 1
                continue
            break
    for stream in clients:
        await stream.aclose()
    for listener in listeners:
        await listener.aclose()
    assert sum(served) == 64
    assert sum(1 for count in served if count) > 1


@pytest.mark.parametrize("shared", [False, True])
async def test_a_port_something_else_holds_is_refused_even_if_it_shares_ports(shared: bool) -> None:
    """A port bound by another socket (a plain one, or one group of a second hub) fails with EADDRINUSE."""
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind((LOOPBACK, 0))
        other.listen()
        with pytest.raises(OSError, match="in use") as refused:
            await open_listeners(LOOPBACK, other.getsockname()[1])
    assert refused.value.errno == errno.EADDRINUSE
