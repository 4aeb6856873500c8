"""The self-upgrade's shared record: the marker ``<dataDir>/upgrade.json`` and the ``<dataDir>/current`` link.

The contract between the agent's NodeUpgradeJob actions (:mod:`roles.edge.upgrade.upgrade`), which switch
to a new version and judge its health, and the launcher (:mod:`roles.edge.launcher.launcher`), which starts
whatever ``current`` points at and rolls back a version on probation that fails. Both are written
atomically (a temporary name, then ``os.replace``). Standard library and msgspec only: the
launcher imports it.
"""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Final

import msgspec

from roles.common.files import link_atomically, write_atomically

__all__ = [
    "CURRENT_LINK",
    "MARKER_FILE",
    "MarkerState",
    "UpgradeMarker",
    "current_target",
    "read_marker",
    "switch_current",
    "write_marker",
]

MARKER_FILE: Final = "upgrade.json"
CURRENT_LINK: Final = "current"


class MarkerState(StrEnum):
    """Where a self-upgrade stands, as the agents and the launcher record it in the marker."""

    SWITCHED = "switched"
    """``current`` points at the new version, which is on probation."""
    HEALTHY = "healthy"
    """The new version reached a hub: the upgrade is kept."""
    UNHEALTHY = "unhealthy"
    """The new version gave up on its health check and asks to be rolled back."""
    ROLLED_BACK = "rolled_back"
    """The launcher pointed ``current`` back at the previous version."""


class UpgradeMarker(msgspec.Struct, frozen=True, kw_only=True):
    """The self-upgrade in progress on this device (fields only ever added, with defaults)."""

    job_uid: str
    """The upgrading task's key: its job UID, with its attempt for a retry (``NodeTask.key``), so that a
    retried upgrade is a new switch with its own deadline."""
    from_version: str
    to_version: str
    previous: str
    """The ``current`` link's target before the switch; empty when the base installation ran."""
    state: MarkerState
    deadline_s: float
    reason: str = ""


def read_marker(data_dir: Path) -> UpgradeMarker | None:
    """The marker, or None when there is none (or it is unreadable: then nothing is on probation)."""
    try:
        return msgspec.json.decode((data_dir / MARKER_FILE).read_bytes(), type=UpgradeMarker)
    except (OSError, msgspec.DecodeError):
        return None


def write_marker(data_dir: Path, marker: UpgradeMarker) -> None:
    """Replace the marker atomically."""
    data_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(data_dir / MARKER_FILE, msgspec.json.encode(marker))


def current_target(data_dir: Path) -> str:
    """Where ``<dataDir>/current`` points (relative to the data directory), or "" for the base installation."""
    link = data_dir / CURRENT_LINK
    return os.readlink(link) if link.is_symlink() else ""


def switch_current(data_dir: Path, target: str) -> None:
    """Point ``current`` at ``target`` (e.g. ``versions/v0.2.0``) atomically; "" removes it (the base installation)."""
    link = data_dir / CURRENT_LINK
    if target:
        link_atomically(link, target)
    else:
        link.unlink(missing_ok=True)
