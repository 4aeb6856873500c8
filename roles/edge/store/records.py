"""What the edge store returns: a node task, an action's result, a queued or dropped report, the exclusive hold.

Plain frozen values, and how their times are written in the store file; the tables that hold them are
:mod:`.task_rows`, :mod:`.outbox_rows` and :mod:`.hold_rows`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Final

import msgspec

__all__ = [
    "NO_SPEC",
    "ActionProgress",
    "DroppedReport",
    "ExclusiveHold",
    "NodeTask",
    "OutboxReport",
    "TaskNotFoundError",
    "TaskState",
    "stamp",
    "time_of",
    "utc_now",
]

NO_SPEC: Final = b""
"""The spec of a task refused on arrival, and of a finished one once its reports have left the outbox."""


class TaskNotFoundError(LookupError):
    """No node task with this job UID is stored."""


class TaskState(StrEnum):
    """Where a received node task stands on this node."""

    RUNNING = "running"
    WAITING_CONFIRMATION = "waiting_confirmation"
    FINISHED = "finished"


class _Record(msgspec.Struct, frozen=True, kw_only=True):
    """Base of the values the store returns."""


class NodeTask(_Record, frozen=True):
    """A node task as received from a hub (a RunAction), and how far it has come.

    A task is its job UID and its attempt (1 unless the job was retried); the store keeps the latest
    attempt of each job, which replaced the ones before it.
    """

    job_uid: str
    route: str
    job_type: str
    spec: bytes
    """The job's spec as the hub sent it (JSON); empty for a task refused on arrival, and for a finished one
    once its reports have left the outbox."""
    run_action_id: str
    received_at: datetime
    state: TaskState
    current_action: str
    attempt: int = 1

    @property
    def key(self) -> str:
        """What names this attempt's own records on the device (facts, backups, the launcher's marker):
        the job UID for attempt 1, as before retries existed, so an upgrade in flight across an agent
        upgrade finds its records; ``<uid>.attempt-<n>`` for a retry, which must not find attempt 1's."""
        return self.job_uid if self.attempt <= 1 else f"{self.job_uid}.attempt-{self.attempt}"


class ActionProgress(_Record, frozen=True):
    """The result of one action of one node task."""

    job_uid: str
    action: str
    succ: bool
    finish_time: str = ""
    """RFC 3339, as reported."""
    reason: str = ""
    extend: str = ""


class OutboxReport(_Record, frozen=True):
    """A report waiting for a hub's acknowledgement; ``seq`` is never reused by this store file."""

    seq: int
    route: str
    job_uid: str
    action: str
    succ: bool
    finish_time: str = ""
    reason: str = ""
    extend: str = ""
    attempt: int = 0
    """The attempt the result belongs to; 0 for a report queued by an agent that knew no attempts."""


class DroppedReport(_Record, frozen=True):
    """A report given up on (the hub refused it for good), kept for inspection."""

    report: OutboxReport
    reason: str
    dropped_at: datetime


class StoreCounts(_Record, frozen=True):
    """What the store holds, counted in one read (the agent's metrics and ``edge status``)."""

    tasks: dict[str, int]
    """Node tasks by :class:`TaskState` value (finished ones until pruned)."""
    outbox_depth: int
    dropped: int
    """Dropped reports kept for inspection (the latest ``DROPPED_KEPT``)."""
    used_bytes: int


class ExclusiveHold(_Record, frozen=True):
    """The node task currently running an upgrade or config update on this node."""

    job_uid: str
    route: str
    kind: str
    since: datetime

    def describe(self) -> str:
        """A human description of the holder, for a refusal's reason."""
        return f"{self.kind} {self.route} (job {self.job_uid}) since {self.since.isoformat()}"


def utc_now() -> datetime:
    """The default clock of the store's stamps."""
    return datetime.now(UTC)


def stamp(moment: datetime) -> str:
    """A time as the store writes it."""
    # One zone for every stored time, so that their text sorts as the times do.
    return moment.astimezone(UTC).isoformat()


def time_of(text: str) -> datetime:
    """A time the store wrote with :func:`stamp`."""
    return datetime.fromisoformat(text)
