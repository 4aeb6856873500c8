"""Which Tasks of a stage a Diagnosis's checkpoint has counted: one bit per target node.

KubeDiag counts each ended Task of a stage once by listing its name in
``checkpoint.synchronizedTasks``. That list grows with the targets: over 5,000 nodes with long
names it alone passes etcd's 1.5 MiB object limit, and the status can never be written again. A
Task is a stage on a node, and ``status.nodeNames`` is fixed when the run starts, so the checkpoint
keeps one bit per target node instead (``synchronizedNodes``): bit ``i`` is set once the Task of
``nodeNames[i]`` in the checkpoint's stage has been counted. The bits are stored least significant
first in each byte, trailing zero bytes left out, as base64: 5,000 nodes take at most 836 characters,
and a stage nothing has ended in yet leaves the field out.

A status written by an older controller lists the names instead; :func:`counted_nodes` reads them as
the bits they stand for, so a controller upgraded in the middle of a stage counts none of those
Tasks again, and its next write has the bits and no names.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

import msgspec

from schemas.diagnosis.v1 import Checkpoint

__all__ = ["CountedNodes", "InvalidCountError", "counted_nodes"]


class InvalidCountError(ValueError):
    """A checkpoint whose record of counted Tasks cannot be read, or disagrees with its counts."""


class CountedNodes:
    """A set of node indexes below ``size``, added to in place while one decision counts Tasks."""

    __slots__ = ("_bits", "_count", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._bits = bytearray((size + 7) // 8)
        self._count = 0

    @classmethod
    def decode(cls, text: str | msgspec.UnsetType, size: int) -> CountedNodes:
        """The set ``text`` (as :meth:`encode` writes it) stands for, over ``size`` nodes.

        Errors: :class:`InvalidCountError` for text that is not base64, or names a node past ``size``.
        """
        counted = cls(size)
        if not isinstance(text, str) or not text:
            return counted
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidCountError(f"checkpoint.synchronizedNodes is not base64: {exc}") from None
        if len(raw) > len(counted._bits):
            raise InvalidCountError(f"checkpoint.synchronizedNodes names a node past the {size} in status.nodeNames")
        counted._bits[: len(raw)] = raw
        if size % 8 and counted._bits[-1] >> (size % 8):  # the last byte's bits past the last node
            raise InvalidCountError(f"checkpoint.synchronizedNodes names a node past the {size} in status.nodeNames")
        counted._count = sum(byte.bit_count() for byte in raw)
        return counted

    def encode(self) -> str | msgspec.UnsetType:
        """The set as base64 of its bits; unset (left out of the checkpoint) for the empty set."""
        if not self._count:
            return msgspec.UNSET
        return base64.b64encode(bytes(self._bits).rstrip(b"\0")).decode()

    def add(self, index: int) -> None:
        if not 0 <= index < self.size:
            raise IndexError(f"node {index} of {self.size}")
        mask = 1 << (index % 8)
        if not self._bits[index // 8] & mask:
            self._bits[index // 8] |= mask
            self._count += 1

    def __contains__(self, index: object) -> bool:
        if not isinstance(index, int) or not 0 <= index < self.size:
            return False
        return bool(self._bits[index // 8] & (1 << (index % 8)))

    def __len__(self) -> int:
        return self._count


def counted_nodes(checkpoint: Checkpoint, names: Sequence[str]) -> CountedNodes:
    """The nodes whose Task of the checkpoint's stage is counted; ``names[i]`` is the Task of node ``i``.

    Reads ``synchronizedNodes`` and, from a status an older controller wrote, the Task names in
    ``synchronizedTasks``. Errors: :class:`InvalidCountError` when they cannot be read, name a Task
    that is not one of the stage's, or do not add up to ``succeeded`` and ``failed``.
    """
    counted = CountedNodes.decode(checkpoint.synchronized_nodes, len(names))
    legacy = checkpoint.synchronized_tasks
    if isinstance(legacy, tuple) and legacy:
        index = {name: i for i, name in enumerate(names)}
        for name in legacy:
            i = index.get(name)
            if i is None:
                raise InvalidCountError(f"checkpoint.synchronizedTasks names {name}, not a Task of this stage")
            counted.add(i)
    ended = checkpoint.succeeded + checkpoint.failed
    if len(counted) != ended:
        raise InvalidCountError(
            f"the checkpoint counts {ended} ended Tasks (succeeded and failed) but records {len(counted)} as counted"
        )
    return counted
