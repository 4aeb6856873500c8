"""Websocket frames on the hub's side (RFC 6455, no extensions): the edge's parsed, the hub's encoded.

wsproto's frame layer costs about 25 µs a frame on the hub's machine, a quarter of the hub's CPU
per ping or heartbeat echo: a generator and an event object per frame, and a buffer class over
every byte. The hub only ever needs the server's side without extensions, which fits in this
module: :class:`FrameReader` turns bytes as they arrive into messages (and notes pings, pongs and
a close), or a :class:`ProtocolFailure` naming the close code the peer earned. Pure: no I/O.
"""

from __future__ import annotations

from typing import Final, final

__all__ = [
    "MESSAGE_TOO_BIG",
    "NO_STATUS",
    "FrameReader",
    "ProtocolFailure",
    "close_frame",
    "data_frame",
    "ping_frame",
    "pong_frame",
]

PROTOCOL_ERROR: Final = 1002
NO_STATUS: Final = 1005
"""A close frame without a code (never sent in one, RFC 6455 7.4.1)."""
INVALID_DATA: Final = 1007
MESSAGE_TOO_BIG: Final = 1009

_CONTINUATION, _TEXT, _BINARY, _CLOSE, _PING, _PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
_CONTROL_MAX: Final = 125
_LENGTH_16, _LENGTH_64 = 126, 127
"""Length bytes that say the length follows in 2 or 8 bytes."""
_REASON_MAX: Final = 123
_SENDABLE_CODES: Final = frozenset({1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014})


@final
class ProtocolFailure(Exception):
    """The peer broke the protocol (or the size limit): close the websocket with ``code``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _unmask(payload: bytes | bytearray, mask: bytes | bytearray) -> bytes:
    size = len(payload)
    if not size:
        return b""
    key = int.from_bytes((mask * ((size >> 2) + 1))[:size], "little")
    return (int.from_bytes(payload, "little") ^ key).to_bytes(size, "little")


def _close_payload(payload: bytes) -> tuple[int, str]:
    if not payload:
        return NO_STATUS, ""
    if len(payload) == 1:
        raise ProtocolFailure(PROTOCOL_ERROR, "a close frame with a one-byte payload")
    code = int.from_bytes(payload[:2], "big")
    if code not in _SENDABLE_CODES and not 3000 <= code <= 4999:
        raise ProtocolFailure(PROTOCOL_ERROR, f"close code {code} may not be sent")
    try:
        reason = payload[2:].decode()
    except UnicodeDecodeError:
        raise ProtocolFailure(INVALID_DATA, "a close reason that is not UTF-8") from None
    return code, reason


@final
class FrameReader:
    """The frames an edge sends, parsed as its bytes arrive; messages at most ``max_message_bytes``."""

    __slots__ = ("_kind", "_parts", "_pending", "closed_with", "max_message_bytes", "pings", "pongs")

    def __init__(self, max_message_bytes: int) -> None:
        self.max_message_bytes = max_message_bytes
        self.pings: list[bytes] = []
        """Payloads of the pings received, for the caller to answer (and clear)."""
        self.pongs: list[bytes] = []
        """Payloads of the pongs received, for the caller to match (and clear)."""
        self.closed_with: tuple[int, str] | None = None
        """The code and reason of the peer's close frame, once it came (nothing after it is read)."""
        self._pending: bytearray | None = None
        """Bytes of a frame not yet complete."""
        self._kind = 0
        """The opcode of the fragmented message under way (0: none)."""
        self._parts = bytearray()
        """The payload so far of the fragmented message under way: one buffer, not an object per
        fragment, so that a peer sending empty or one-byte fragments holds no more than their bytes."""

    def feed(self, data: bytes | bytearray) -> list[str | bytes]:
        """The messages ``data`` completes, in order. Errors: :class:`ProtocolFailure`."""
        got: list[str | bytes] = []
        if self.closed_with is not None:
            return got
        buffer: bytes | bytearray
        if self._pending is None:
            buffer = data
        else:
            self._pending += data
            buffer = self._pending
        end = len(buffer)
        at = 0
        while at < end and self.closed_with is None:
            after = self._frame(buffer, at, end, got)
            if after < 0:
                break
            at = after
        if at >= end or self.closed_with is not None:
            self._pending = None
        elif self._pending is None:
            self._pending = bytearray(buffer[at:])
        else:
            del self._pending[:at]
        return got

    def _frame(self, buffer: bytes | bytearray, at: int, end: int, got: list[str | bytes]) -> int:
        """Parse the frame at ``at``: the offset after it, or -1 if it is not all there yet."""
        header = _header(buffer, at, end)
        if header is None:
            return -1
        fin, opcode, size, head = header
        self._check_size(fin, opcode, size)
        after = head + 4 + size
        if after > end:
            return -1
        payload = _unmask(buffer[head + 4 : after], buffer[head : head + 4])
        if opcode == _TEXT or opcode == _BINARY:  # noqa: PLR1714, SIM109 (the common case first, without a set)
            if self._kind:
                raise ProtocolFailure(PROTOCOL_ERROR, "a new message inside a fragmented one")
            if fin:
                got.append(_message(opcode, payload))
            else:
                self._kind = opcode
                self._parts += payload
        elif opcode == _CONTINUATION:
            if not self._kind:
                raise ProtocolFailure(PROTOCOL_ERROR, "a continuation frame with no message under way")
            self._parts += payload
            if fin:
                got.append(_message(self._kind, bytes(self._parts)))
                self._kind = 0
                self._parts = bytearray()
        else:
            self._control(opcode, payload)
        return after

    def _check_size(self, fin: int, opcode: int, size: int) -> None:
        """Known from the header, so that the hub neither waits for nor keeps a payload over a limit."""
        if opcode >= _CLOSE:
            if not fin or size > _CONTROL_MAX:
                raise ProtocolFailure(PROTOCOL_ERROR, "a control frame fragmented or longer than 125 bytes")
        elif len(self._parts) + size > self.max_message_bytes:
            raise ProtocolFailure(MESSAGE_TOO_BIG, f"Exceeded maximum message size: {self.max_message_bytes} bytes")

    def _control(self, opcode: int, payload: bytes) -> None:
        if opcode == _PING:
            self.pings.append(payload)
        elif opcode == _PONG:
            self.pongs.append(payload)
        elif opcode == _CLOSE:
            self.closed_with = _close_payload(payload)
        else:
            raise ProtocolFailure(PROTOCOL_ERROR, f"unknown opcode {opcode:#x}")


def _header(buffer: bytes | bytearray, at: int, end: int) -> tuple[int, int, int, int] | None:
    """A frame's FIN bit, opcode, payload length and where its mask starts; None if not all there yet."""
    if end - at < 2:
        return None
    first, second = buffer[at], buffer[at + 1]
    if first & 0x70:
        raise ProtocolFailure(PROTOCOL_ERROR, "reserved bits set without an extension")
    if not second & 0x80:
        raise ProtocolFailure(PROTOCOL_ERROR, "a client frame that is not masked")
    size = second & 0x7F
    head = at + 2
    if size == _LENGTH_16:
        if end - head < 2:
            return None
        size = int.from_bytes(buffer[head : head + 2], "big")
        head += 2
    elif size == _LENGTH_64:
        if end - head < 8:
            return None
        size = int.from_bytes(buffer[head : head + 8], "big")
        if size >> 63:
            raise ProtocolFailure(PROTOCOL_ERROR, "a frame length with its top bit set")
        head += 8
    return first & 0x80, first & 0x0F, size, head


def _message(opcode: int, payload: bytes) -> str | bytes:
    if opcode == _BINARY:
        return payload
    try:
        return payload.decode()
    except UnicodeDecodeError:
        raise ProtocolFailure(INVALID_DATA, "a text message that is not UTF-8") from None


def _frame(opcode: int, payload: bytes) -> bytes:
    size = len(payload)
    if size <= _CONTROL_MAX:
        return bytes((0x80 | opcode, size)) + payload
    if size < 1 << 16:
        return bytes((0x80 | opcode, _LENGTH_16)) + size.to_bytes(2, "big") + payload
    return bytes((0x80 | opcode, _LENGTH_64)) + size.to_bytes(8, "big") + payload


def data_frame(payload: bytes) -> bytes:
    """A binary message from the hub, in one frame (a server's frames are not masked)."""
    return _frame(_BINARY, payload)


def pong_frame(payload: bytes) -> bytes:
    return _frame(_PONG, payload)


def ping_frame(payload: bytes) -> bytes:
    return _frame(_PING, payload)


def close_frame(code: int, reason: str = "") -> bytes:
    """A close frame with ``code`` (none for :data:`NO_STATUS`) and as much of ``reason`` as fits."""
    if code == NO_STATUS:
        return _frame(_CLOSE, b"")
    text = reason.encode()[:_REASON_MAX].decode(errors="ignore").encode()
    return _frame(_CLOSE, code.to_bytes(2, "big") + text)
