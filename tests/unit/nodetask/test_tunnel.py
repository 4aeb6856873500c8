"""Tunnels inside a session: bytes in order, per-tunnel flow control, stalls cut, closes and breaks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from nodetask.link import LinkClosed
from nodetask.messages import TunnelClose, TunnelCredit
from nodetask.tunnel import MAX_PAYLOAD, SendFrame, SendMessage, Tunnels, TunnelStream, data_frame, is_data, read_data


@dataclass
class Pair:
    """Two session ends whose frames reach each other at once (what a link does, minus its delay)."""

    sent_frames: list[bytes] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    cut_link: bool = False

    a: Tunnels = field(init=False)
    b: Tunnels = field(init=False)

    def __post_init__(self) -> None:
        self.a = Tunnels(self._to(lambda: self.b), self._msg_to(lambda: self.b), window=1024, stall_s=5.0)
        self.b = Tunnels(self._to(lambda: self.a), self._msg_to(lambda: self.a), window=1024, stall_s=5.0)

    def _to(self, peer: Callable[[], Tunnels]) -> SendFrame:
        async def send_frame(frame: bytes) -> None:
            if self.cut_link:
                raise LinkClosed("the link is closed")
            self.sent_frames.append(frame)
            if problem := peer().data(frame):
                self.problems.append(problem)

        return send_frame

    def _msg_to(self, peer: Callable[[], Tunnels]) -> SendMessage:
        async def send_message(msg: TunnelClose | TunnelCredit) -> None:
            if self.cut_link:
                raise LinkClosed("the link is closed")
            if isinstance(msg, TunnelCredit):
                peer().credit(msg)
            else:
                peer().close(msg)

        return send_message

    def open(self, number: int = 1) -> tuple[TunnelStream, TunnelStream]:
        return self.a.add(number), self.b.add(number)


async def _read_all(stream: TunnelStream) -> bytes:
    got = bytearray()
    try:
        while True:
            got += await stream.receive(100)
    except anyio.EndOfStream:
        return bytes(got)


def test_a_data_frame_is_told_from_a_message_by_its_first_byte() -> None:
    """A data frame starts with a zero byte and round-trips its tunnel number and bytes; JSON does not."""
    frame = data_frame(4_000_000_000, b"hello")
    assert is_data(frame)
    assert read_data(frame) == (4_000_000_000, b"hello")
    assert not is_data(b'{"op":"heartbeat"}')
    assert not is_data('{"op":"heartbeat"}')


async def test_bytes_arrive_in_order_and_the_close_ends_the_stream_after_them() -> None:
    """What one end sends, in any pieces, the other reads in order, then the end of the stream."""
    pair = Pair()
    a, b = pair.open()
    payload = bytes(range(256)) * 20
    async with anyio.create_task_group() as tg:

        async def write() -> None:
            await a.send(payload[:1000])
            await a.send(payload[1000:])
            await a.aclose()

        tg.start_soon(write)
        assert await _read_all(b) == payload
    assert not pair.problems


@settings(max_examples=40, deadline=None)
@given(pieces=st.lists(st.binary(min_size=1, max_size=3000), max_size=8), read_size=st.integers(1, 2000))
def test_any_pieces_read_in_any_sizes_arrive_whole(pieces: list[bytes], read_size: int) -> None:
    """However the sender splits its bytes and the reader asks for them, the bytes arrive whole and in order."""

    async def main() -> bytes:
        pair = Pair()
        a, b = pair.open()
        got = bytearray()
        async with anyio.create_task_group() as tg:

            async def write() -> None:
                for piece in pieces:
                    await a.send(piece)
                await a.aclose()

            tg.start_soon(write)
            try:
                while True:
                    got += await b.receive(read_size)
            except anyio.EndOfStream:
                pass
        return bytes(got)

    assert trio.run(main) == b"".join(pieces)


async def test_a_sender_waits_for_credit_once_the_window_is_unread() -> None:
    """With a window of unread bytes at the other end, the sender waits; reading lets it go on."""
    pair = Pair()
    a, b = pair.open()
    sent = anyio.Event()
    async with anyio.create_task_group() as tg:

        async def write() -> None:
            await a.send(b"x" * 3000)
            sent.set()

        tg.start_soon(write)
        await trio.testing.wait_all_tasks_blocked()
        assert not sent.is_set()
        assert b.buffered == 1024
        got = bytearray()
        while len(got) < 3000:
            got += await b.receive(300)
        await sent.wait()
    assert got == b"x" * 3000


async def test_a_tunnel_whose_reader_stalls_is_cut_and_the_others_flow(autojump_clock: trio.testing.MockClock) -> None:
    """A tunnel whose reader reads nothing for the stall time is cut, with a reason, on both ends; another goes on."""
    pair = Pair()
    a, b = pair.open(1)
    other_a, other_b = pair.open(2)
    with pytest.raises(anyio.BrokenResourceError, match="stalled"):
        await a.send(b"y" * 2048)
    assert await b.receive() == b"y" * 1024  # what came before the cut is still read
    with pytest.raises(anyio.BrokenResourceError, match="stalled"):
        await b.receive()
    await other_a.send(b"still here")
    assert await other_b.receive() == b"still here"
    assert 1 not in pair.a
    assert 1 not in pair.b


async def test_bytes_beyond_the_window_break_the_tunnel_with_a_problem() -> None:
    """A peer that sends more than the window without credit breaks that tunnel, and the problem is named."""
    pair = Pair()
    _, b = pair.open()
    problem = pair.b.data(data_frame(1, b"z" * MAX_PAYLOAD))
    assert "beyond its window" in problem
    with pytest.raises(anyio.BrokenResourceError, match="beyond its window"):
        await b.receive()


async def test_a_close_with_a_reason_breaks_the_other_end() -> None:
    """A tunnel closed with a reason is a break at the other end, naming it."""
    pair = Pair()
    a, b = pair.open()
    await pair.a.cut(a, "cannot reach the API server")
    with pytest.raises(anyio.BrokenResourceError, match="cannot reach the API server"):
        await b.receive()


async def test_the_session_ending_breaks_every_tunnel_and_opens_no_new_one() -> None:
    """When the session ends, every tunnel's reader and writer fail with the reason, and none can be added."""
    pair = Pair()
    a, _ = pair.open(1)
    c, _ = pair.open(2)
    pair.a.end("the hub went away")
    with pytest.raises(anyio.BrokenResourceError, match="the hub went away"):
        await a.receive()
    with pytest.raises(anyio.BrokenResourceError, match="the hub went away"):
        await c.send(b"x")
    with pytest.raises(anyio.BrokenResourceError):
        pair.a.add(3)
    assert len(pair.a) == 0
    assert len(pair.b) == 2  # the other end learns of it from its own session's end


async def test_a_send_on_a_lost_link_breaks_the_tunnel() -> None:
    """A send that finds the session's link gone breaks the tunnel instead of raising the link's error."""
    pair = Pair()
    a, _ = pair.open()
    pair.cut_link = True
    with pytest.raises(anyio.BrokenResourceError, match="the link is closed"):
        await a.send(b"x")


async def test_bytes_for_a_tunnel_already_closed_are_dropped() -> None:
    """Bytes in flight to a tunnel this end has closed are no problem and go nowhere."""
    pair = Pair()
    _, b = pair.open()
    await b.aclose()
    assert pair.b.data(data_frame(1, b"late")) == ""
    assert pair.b.data(data_frame(99, b"unknown")) == ""


async def test_a_truncated_data_frame_is_a_problem() -> None:
    """A data frame too short for its header is refused with a message saying so."""
    pair = Pair()
    assert "no room for its header" in pair.b.data(b"\x00\x01")
