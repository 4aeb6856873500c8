"""The hub's websocket frame codec against wsproto's: what an edge's client sends is read back whole."""

from __future__ import annotations

import itertools
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st
from wsproto import ConnectionType
from wsproto.connection import Connection
from wsproto.events import BytesMessage, CloseConnection, Ping, Pong
from wsproto.frame_protocol import FrameProtocol, Opcode

from roles.cloud.transport.ws_frames import (
    MESSAGE_TOO_BIG,
    NO_STATUS,
    FrameReader,
    ProtocolFailure,
    close_frame,
    data_frame,
    ping_frame,
    pong_frame,
)

# One thing an edge's client does: a message in 1-3 fragments, or a ping.
_messages = st.one_of(st.text(max_size=300), st.binary(max_size=300))
_items = st.one_of(
    st.tuples(st.just("message"), _messages, st.integers(min_value=1, max_value=3)),
    st.tuples(st.just("ping"), st.binary(max_size=125), st.just(1)),
)


def _client_bytes(items: list[tuple[str, str | bytes, int]]) -> bytes:
    client = FrameProtocol(client=True, extensions=[])
    out = b""
    for kind, value, pieces in items:
        if kind == "ping":
            assert isinstance(value, bytes)
            out += client.ping(value)
            continue
        step = max(1, -(-len(value) // pieces))
        chunks = [value[i : i + step] for i in range(0, len(value), step)] or [value]
        for index, chunk in enumerate(chunks):
            out += client.send_data(chunk, fin=index == len(chunks) - 1)
    return out


@given(items=st.lists(_items, max_size=8), cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=6))
def test_whatever_a_client_sends_split_anywhere_is_read_back_in_order(
    items: list[tuple[str, str | bytes, int]], cuts: list[int]
) -> None:
    """Messages (fragmented or not) and pings, cut into chunks at any points, come out whole and in order."""
    data = _client_bytes(items)
    points = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    reader = FrameReader(max_message_bytes=1 << 20)
    messages: list[str | bytes] = []
    for start, end in itertools.pairwise(points):
        messages += reader.feed(data[start:end])
    assert messages == [value for kind, value, _ in items if kind == "message"]
    assert reader.pings == [value for kind, value, _ in items if kind == "ping"]
    assert [type(m) for m in messages] == [type(value) for kind, value, _ in items if kind == "message"]


def test_a_close_frame_is_noted_with_its_code_and_nothing_after_it_is_read() -> None:
    """The client's close code and reason are kept; a message behind the close is not delivered."""
    client = FrameProtocol(client=True, extensions=[])
    reader = FrameReader(max_message_bytes=100)
    assert reader.feed(client.send_data("before", fin=True) + client.close(1001, "going") + b"\x81") == ["before"]
    assert reader.closed_with == (1001, "going")
    assert reader.feed(client.send_data("after", fin=True)) == []


def test_a_close_frame_without_a_code_is_noted_as_no_status() -> None:
    """An empty close payload means 1005, which the hub answers with an empty close."""
    reader = FrameReader(max_message_bytes=100)
    reader.feed(FrameProtocol(client=True, extensions=[]).close())
    assert reader.closed_with == (NO_STATUS, "")
    assert close_frame(NO_STATUS) == b"\x88\x00"


def _masked(first: int, payload: bytes) -> bytes:
    """A frame with its first byte as given and a zero mask (so the payload reads as is)."""
    assert len(payload) <= 125
    return bytes((first, 0x80 | len(payload))) + b"\0\0\0\0" + payload


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"\x81\x05hello", 1002),  # not masked
        (_masked(0xC1, b"x"), 1002),  # RSV1 without an extension
        (_masked(0x83, b"x"), 1002),  # a reserved data opcode
        (_masked(0x8B, b""), 1002),  # a reserved control opcode
        (_masked(0x09, b""), 1002),  # a fragmented ping
        (bytes((0x89, 0xFE, 0, 126)) + b"\0" * 130, 1002),  # a ping over 125 bytes
        (_masked(0x80, b"x"), 1002),  # a continuation with no message under way
        (_masked(0x01, b"a") + _masked(0x81, b"b"), 1002),  # a new message inside a fragmented one
        (_masked(0x88, b"\x03"), 1002),  # a one-byte close payload
        (_masked(0x88, (1006).to_bytes(2, "big")), 1002),  # a close code that may not be sent
        (_masked(0x88, (1000).to_bytes(2, "big") + b"\xff"), 1007),  # a close reason that is not UTF-8
        (_masked(0x81, b"\xff"), 1007),  # text that is not UTF-8
        (_masked(0x01, b"\xc3") + _masked(0x80, b"\x28"), 1007),  # ... across fragments
    ],
)
def test_frames_that_break_the_protocol_name_their_close_code(data: bytes, code: int) -> None:
    """Each way a client can break RFC 6455 is refused with the close code it earns."""
    with pytest.raises(ProtocolFailure) as failure:
        FrameReader(max_message_bytes=100).feed(data)
    assert failure.value.code == code


def test_a_message_over_the_limit_is_refused_from_its_header() -> None:
    """A frame declaring more than the limit, or fragments adding up past it, fail before the payload is there."""
    client = FrameProtocol(client=True, extensions=[])
    at_limit = client.send_data(b"x" * 100, fin=True)
    assert FrameReader(max_message_bytes=100).feed(at_limit) == [b"x" * 100]
    header_only = client.send_data(b"y" * 101, fin=True)[:8]
    with pytest.raises(ProtocolFailure) as failure:
        FrameReader(max_message_bytes=100).feed(header_only)
    assert failure.value.code == MESSAGE_TOO_BIG
    reader = FrameReader(max_message_bytes=100)
    reader.feed(client.send_data(b"z" * 60, fin=False))
    with pytest.raises(ProtocolFailure) as failure:
        reader.feed(client.send_data(b"z" * 60, fin=True))
    assert failure.value.code == MESSAGE_TOO_BIG


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536])
def test_the_hubs_frames_are_read_by_wsprotos_client(size: int) -> None:
    """Binary messages of every length encoding, pings, pongs and a close (reason cut to fit) read as sent."""
    client = Connection(ConnectionType.CLIENT)
    reason = "é" * 100  # 200 bytes: cut to 123 bytes' worth of whole characters
    client.receive_data(data_frame(b"\x07" * size) + ping_frame(b"p") + pong_frame(b"q") + close_frame(4008, reason))
    events = list(client.events())
    assert events[0] == BytesMessage(data=b"\x07" * size, frame_finished=True, message_finished=True)
    assert events[1:3] == [Ping(payload=b"p"), Pong(payload=b"q")]
    assert isinstance(events[3], CloseConnection)
    assert (events[3].code, events[3].reason) == (4008, "é" * 61)
    assert Opcode.BINARY.value == data_frame(b"")[0] & 0x0F


@pytest.mark.parametrize("fragment", [b"", b"f"])
def test_a_message_in_many_tiny_fragments_is_held_at_about_its_payloads_size(fragment: bytes) -> None:
    """Fragments are not kept one object apiece: empty or one-byte fragments cannot grow memory past the limit."""
    count = 20_000
    reader = FrameReader(max_message_bytes=count)
    data = _masked(0x02, b"") + _masked(0x00, fragment) * count
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for at in range(0, len(data), 65536):
            assert reader.feed(data[at : at + 65536]) == []
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 2 * count * len(fragment) + 16384
    assert reader.feed(_masked(0x80, b"")) == [fragment * count]
