"""The note a ConfigUpdateJob leaves beside the configuration it replaced, and the restore it guides.

While an updated configuration has not yet run healthily, ``<config>.pending-update`` names the
backup of the previous file. An agent that cannot even start with the new file (a file it names is
gone, a value it cannot use, any error before it reaches a hub) must not exit for good or
crash-loop: the role's entry point (and the launcher, for a file it cannot load) calls
:func:`restore_after_failed_start`, which puts the backup back, records why in the note and lets
the agent restart, which then fails Update with that reason and reports RollBack
(:mod:`roles.edge.config_update.config_update`). The note sits beside the configuration, not in the store,
because a file that cannot be loaded does not say where the store is.

Standard library and msgspec only: the launcher imports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import msgspec

from roles.common.files import write_atomically

__all__ = ["MAX_REASON", "Pending", "clear_pending", "pending_path", "read_pending", "restore_after_failed_start"]


MAX_REASON: Final = 500
"""Characters kept of why a start failed: it is reported upstream, and an exception's text can be long."""


class Pending(msgspec.Struct, frozen=True, kw_only=True):
    """The note beside a configuration that an update replaced and no agent has yet run healthily."""

    job_uid: str
    """The updating task's key: its job UID, with its attempt for a retry (``NodeTask.key``)."""
    backup: str
    failed: str = ""
    """Why the agent could not start with the new file, once the backup was put back."""


def pending_path(config_file: Path) -> Path:
    """The note beside ``config_file`` while an update of it is on probation."""
    return config_file.with_name(f"{config_file.name}.pending-update")


def read_pending(config_file: Path) -> Pending | None:
    """The note beside ``config_file``, or None when there is none (or it is unreadable)."""
    try:
        return msgspec.json.decode(pending_path(config_file).read_bytes(), type=Pending)
    except (OSError, msgspec.DecodeError):
        return None


def clear_pending(config_file: Path) -> None:
    """Remove the note: the update ended, one way or the other."""
    pending_path(config_file).unlink(missing_ok=True)


def restore_after_failed_start(config_file: Path, reason: str) -> bool:
    """Put back the configuration an update replaced, because the agent failed to start with the new one.

    True if it did: the caller restarts the agent, which then reports the update failed with
    ``reason`` and rolled back. False when no update is on probation, or the file already is the
    previous one (which then fails by itself: restarting would only loop). Synchronous: it runs
    where the agent failed, outside any event loop.
    """
    pending = read_pending(config_file)
    if pending is None:
        return False
    try:
        previous = Path(pending.backup).read_bytes()
    except OSError:
        return False
    try:
        if config_file.read_bytes() == previous:
            return False
    except OSError:
        pass  # gone or unreadable: put the previous one back
    if not pending.failed:
        # The reason first: if the agent dies between the two writes, the next failed start puts the
        # backup back and keeps it.
        note = msgspec.structs.replace(pending, failed=reason[:MAX_REASON] or "the agent failed to start")
        write_atomically(pending_path(config_file), msgspec.json.encode(note))
    write_atomically(config_file, previous)
    return True
