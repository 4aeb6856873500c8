"""The bench's lean edge frames messages as the hub's frame reader reads them, and reads the hub's frames."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bench.lean_edge import client_frame, server_frames
from roles.cloud.transport.ws_frames import FrameReader, data_frame, pong_frame

_PAYLOADS = st.lists(st.binary(max_size=70_000), min_size=1, max_size=4)


def _cuts(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@given(_PAYLOADS, st.lists(st.integers(min_value=0), max_size=5))
def test_the_hub_reads_the_lean_edges_frames_whatever_their_size_and_however_they_are_split(
    payloads: list[bytes], cuts: list[int]
) -> None:
    """Binary client frames (masked with the zero key) come out of the hub's reader as the payloads sent."""
    wire = b"".join(client_frame(0x2, p) for p in payloads)
    reader = FrameReader(max_message_bytes=1 << 20)
    got: list[str | bytes] = []
    for piece in _cuts(wire, cuts):
        got += reader.feed(piece)
    assert got == payloads


@given(_PAYLOADS, st.lists(st.integers(min_value=0), max_size=5))
def test_the_lean_edge_reads_the_hubs_frames_however_they_arrive(payloads: list[bytes], cuts: list[int]) -> None:
    """Data and pong frames from the hub's encoder come out whole, in order, once all their bytes are in."""
    wire = b"".join(data_frame(p) + pong_frame(b"") for p in payloads)
    buffer = bytearray()
    got: list[tuple[int, bytes]] = []
    for piece in _cuts(wire, cuts):
        buffer += piece
        got += server_frames(buffer)
    assert got == [frame for p in payloads for frame in ((0x2, p), (0xA, b""))]
    assert buffer == b""
