"""The error-key ledger: the cached objects the edge failed to store, and whether autonomy is requested.

Every failed write of a cached object (a full disk, an I/O error, an object that cannot be stored)
puts its key here with the reason; the next successful write of that key takes it out. The
autonomy check (:func:`nodetask.autonomy.check`) reads it every 10 s and the repair loop asks the
hub again for what it holds, so it must survive a restart - and it must be writable exactly when
the store is not: on a full disk. So it is not in the store but in a small file of its own,
allocated in full when created and then only overwritten in place, which needs no new space on the
filesystems a device uses (tmpfs, ext4, xfs; not on a copy-on-write one such as btrfs, where a
write may still fail and the ledger says it is not persisted).

The file is two fixed-size slots; each write goes to the slot not holding the newest state, with
a sequence number and a CRC, and is synced before the call returns. A write torn by a power cut
leaves the other slot, one change older, to be read. The same file keeps whether autonomy is
requested (the hub's last :class:`~nodetask.messages.Autonomy`), which the check needs offline and
after a restart, also on a full disk.

When the file cannot be written (it could not be allocated, or the ledger outgrew a slot), the
ledger keeps working in memory and :attr:`Ledger.persisted` says so: the issue's metric of whether
the ledger itself is persisted.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final, final

import anyio
import anyio.to_thread
import msgspec
import structlog

from nodetask.messages import CacheKey

__all__ = [
    "FILE_BYTES",
    "LEDGER_FILE",
    "SLOT_BYTES",
    "ErrorEntry",
    "Ledger",
    "LedgerState",
    "LedgerTooLarge",
    "decode_file",
    "encode_slot",
    "key_text",
]

Log = structlog.typing.FilteringBoundLogger

LEDGER_FILE: Final = "cache-ledger"
"""Its name in the agent's data directory."""
SLOT_BYTES: Final = 64 * 1024
FILE_BYTES: Final = 2 * SLOT_BYTES
MAX_REASON: Final = 300
"""Characters of a failure's reason kept (the condition shows fewer)."""
_MAGIC: Final = b"NTLEDGR1"
_HEADER: Final = struct.Struct("<8sQII")
"""Magic, write number, payload length, then a CRC-32 of those three and the payload (zlib-compressed
JSON): a header torn half-way never passes for another write's."""
_CHECKED: Final = struct.Struct("<8sQI")
_ZEROS: Final = bytes(16 * 1024)


class LedgerTooLarge(ValueError):
    """The ledger does not fit in a slot (thousands of errored keys): it stays in memory only."""


class ErrorEntry(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One errored key and why its last write failed."""

    key: CacheKey
    reason: str


class LedgerState(msgspec.Struct, frozen=True, kw_only=True):
    """What the file holds."""

    requested: bool = False
    errors: tuple[ErrorEntry, ...] = ()


_encoder: Final = msgspec.json.Encoder()
_decoder: Final = msgspec.json.Decoder(LedgerState)


def key_text(key: CacheKey) -> str:
    """How a key reads in logs and in the condition's message: ``Pod/default/web-1``, ``Node/edge-1``."""
    return f"{key.kind}/{key.namespace}/{key.name}" if key.namespace else f"{key.kind}/{key.name}"


def encode_slot(seq: int, state: LedgerState) -> bytes:
    """The start of a slot (at most :data:`SLOT_BYTES`) holding ``state`` as write number ``seq``; what
    follows it in the slot is never read. Pure.

    Errors: :class:`LedgerTooLarge` when it does not fit.
    """
    payload = zlib.compress(_encoder.encode(state))
    if _HEADER.size + len(payload) > SLOT_BYTES:
        raise LedgerTooLarge(f"{len(state.errors)} errored keys take {len(payload)} bytes, more than a slot holds")
    checked = _CHECKED.pack(_MAGIC, seq, len(payload))
    return _HEADER.pack(_MAGIC, seq, len(payload), zlib.crc32(checked + payload)) + payload


def _decode_slot(slot: bytes) -> tuple[int, LedgerState] | None:
    if len(slot) < _HEADER.size:
        return None
    magic, seq, length, crc = _HEADER.unpack_from(slot)
    payload = slot[_HEADER.size : _HEADER.size + length]
    if magic != _MAGIC or len(payload) != length or zlib.crc32(_CHECKED.pack(magic, seq, length) + payload) != crc:
        return None
    try:
        return seq, _decoder.decode(zlib.decompress(payload))
    except (zlib.error, msgspec.DecodeError):
        return None


def decode_file(data: bytes) -> tuple[int, LedgerState] | None:
    """The newest intact slot of a ledger file's bytes: its write number and state; None if neither is. Pure."""
    return _newest(data[i : i + SLOT_BYTES] for i in (0, SLOT_BYTES))


def _newest(slots: Iterable[bytes]) -> tuple[int, LedgerState] | None:
    found = [decoded for decoded in map(_decode_slot, slots) if decoded is not None]
    return max(found, key=lambda decoded: decoded[0]) if found else None


def _read(path: Path) -> tuple[int, LedgerState] | None:
    """:func:`decode_file` of the file at ``path``, reading only what its slots hold (None: no file)."""
    try:
        file = path.open("rb")
    except FileNotFoundError:
        return None
    with file:
        slots = []
        for start in (0, SLOT_BYTES):
            file.seek(start)
            header = file.read(_HEADER.size)
            length = _HEADER.unpack(header)[2] if len(header) == _HEADER.size else 0
            slots.append(header + file.read(min(length, SLOT_BYTES - _HEADER.size)))
    return _newest(slots)


def _write(path: Path, seq: int, slot: bytes) -> None:
    """Write ``slot`` as write number ``seq``, allocating the whole file first if it is not yet."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size < FILE_BYTES:
            # Zeros written, not a hole: the space must be the file's before the disk fills up.
            for offset in range(size, FILE_BYTES, len(_ZEROS)):
                os.pwrite(fd, _ZEROS[: FILE_BYTES - offset], offset)
            os.fsync(fd)
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        os.pwrite(fd, slot, (seq % 2) * SLOT_BYTES)
        os.fsync(fd)
    finally:
        os.close(fd)


@final
class Ledger:
    """The ledger in memory, written through to its file on every change. Make one with :meth:`open`.

    Safe to use from several tasks: changes are applied in memory at once and written in order.
    """

    def __init__(self, path: Path, state: LedgerState, seq: int, *, log: Log) -> None:
        self.path = path
        self._errors = {entry.key: entry.reason for entry in state.errors}
        self._requested = state.requested
        self._seq = seq
        self._log = log
        self._lock = anyio.Lock()
        self.persisted = False
        """Whether the file holds the ledger as it is in memory (the issue's ledger-persisted metric)."""

    @classmethod
    async def open(cls, data_dir: Path, *, log: Log) -> Ledger:
        """The ledger kept in ``data_dir``, as last written; its file is allocated now if it is not yet.

        A missing or unreadable file is an empty ledger (logged); nothing here raises for it.
        """
        path = data_dir / LEDGER_FILE
        try:
            found = await anyio.to_thread.run_sync(_read, path)
        except OSError as exc:
            log.error("ledger_unreadable", path=str(path), error=str(exc))
            found = None
        seq, state = found if found is not None else (0, LedgerState())
        ledger = cls(path, state, seq, log=log)
        await ledger._persist()
        if ledger._errors:
            log.warning("ledger_loaded", error_keys=len(ledger._errors), persisted=ledger.persisted)
        return ledger

    @property
    def errors(self) -> Mapping[CacheKey, str]:
        """Each errored key and why its last write failed."""
        return self._errors

    @property
    def requested(self) -> bool:
        """Whether the hub last said this node asks for autonomy."""
        return self._requested

    async def update(
        self,
        *,
        failed: Mapping[CacheKey, str] | None = None,
        cleared: Iterable[CacheKey] = (),
        requested: bool | None = None,
    ) -> None:
        """Record ``failed`` keys (with their reasons), take ``cleared`` ones out, set ``requested``; then
        write the file if anything changed. Never raises for the file: :attr:`persisted` tells."""
        before = (dict(self._errors), self._requested)
        for key in cleared:
            self._errors.pop(key, None)
        for key, reason in (failed or {}).items():
            self._errors[key] = reason[:MAX_REASON]
        if requested is not None:
            self._requested = requested
        if (self._errors, self._requested) == before:
            return
        if len(self._errors) != len(before[0]):
            self._log.info("cache_error_keys", error_keys=len(self._errors), failed=len(failed or {}))
        await self._persist()

    async def _persist(self) -> None:
        async with self._lock:
            state = LedgerState(
                requested=self._requested,
                errors=tuple(
                    ErrorEntry(key=key, reason=reason)
                    for key, reason in sorted(self._errors.items(), key=lambda item: key_text(item[0]))
                ),
            )
            seq = self._seq + 1
            try:
                slot = encode_slot(seq, state)
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(_write, self.path, seq, slot)
            except (OSError, LedgerTooLarge) as exc:
                self._log.error("ledger_not_persisted", path=str(self.path), error=str(exc))
                self.persisted = False
                return
            self._seq = seq
            if not self.persisted:
                self._log.info("ledger_persisted", path=str(self.path), error_keys=len(state.errors))
            self.persisted = True
