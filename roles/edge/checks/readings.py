"""What a host check measures: one usage reading per item, or why it could not be taken.

The one home of these types, so that the decision (:mod:`roles.edge.checks.checks`) and the psutil shell
that measures (:mod:`roles.edge.checks.host`) both stand on it and neither imports the other's module.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

import msgspec

__all__ = ["ROOT", "CheckItem", "DiskReading", "MeasureError", "Reading", "Usage"]

ROOT: Final = "/"


class CheckItem(StrEnum):
    """The check items KubeEdge knows (``checkItems`` in the job specs)."""

    CPU = "cpu"
    MEM = "mem"
    DISK = "disk"


class MeasureError(msgspec.Struct, frozen=True):
    """A reading that could not be taken, and why."""

    error: str


Reading = float | MeasureError
"""A usage percentage in [0, 100], or why it is missing."""


class DiskReading(msgspec.Struct, frozen=True):
    """The usage of the filesystem holding ``path``."""

    path: str
    percent: Reading


class Usage(msgspec.Struct, frozen=True):
    """What was measured; None (or no disks) for an item not measured."""

    cpu: Reading | None = None
    mem: Reading | None = None
    disks: tuple[DiskReading, ...] = ()
    """One per distinct filesystem, ``/`` first."""
