"""The hub's connection wire over a real socket pair, with OpenSSL's want-read/want-write answers simulated."""

from __future__ import annotations

import socket
import ssl

import trio
import trio.testing

from roles.cloud.transport.wire import Wire
from tests.unit.roles.cloud.transport.doubles import WantingSocket


def _filled_pair() -> tuple[WantingSocket, socket.socket]:
    """A connected pair whose first end cannot write until the second reads."""
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    try:
        while True:
            ours.send(b"\0" * 65536)
    except BlockingIOError:
        pass
    return WantingSocket(ours.detach()), theirs


async def test_a_reader_and_a_writer_both_waiting_to_write_take_turns_on_the_socket() -> None:
    """A read that must write first (a TLS handshake record) and a send both wait for room, neither failing."""
    ours, theirs = _filled_pair()
    wire = Wire(ours)
    ours.on_recv.append(ssl.SSLWantWriteError)
    received: list[bytes] = []
    async with trio.open_nursery() as nursery:

        async def read() -> None:
            received.append(await wire.receive())

        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(wire.send, b"frame")
        await trio.testing.wait_all_tasks_blocked()
        peer = trio.socket.from_stdlib_socket(theirs)
        backlog = b""
        while not backlog.endswith(b"frame"):
            backlog += await peer.recv(1 << 20)
        await peer.send(b"ping")
    assert backlog.endswith(b"frame")
    assert received == [b"ping"]
    wire.close()
    peer.close()


async def test_a_writer_and_a_reader_both_waiting_for_data_take_turns_on_the_socket() -> None:
    """A send that must read first (a TLS handshake record) and a receive both wait for data, neither failing."""
    ours, theirs = socket.socketpair()
    wanting = WantingSocket(ours.detach())
    wire = Wire(wanting)
    wanting.on_send.append(ssl.SSLWantReadError)
    received: list[bytes] = []
    peer = trio.socket.from_stdlib_socket(theirs)
    async with trio.open_nursery() as nursery:

        async def read() -> None:
            received.append(await wire.receive())

        nursery.start_soon(wire.send, b"frame")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        await peer.send(b"ping")
    assert await peer.recv(64) == b"frame"
    assert received == [b"ping"]
    wire.close()
    peer.close()
