"""What the launcher decides, as a pure state machine: start, relaunch, roll back, or stop for good.

:func:`decide` takes the launcher's :class:`Supervision` state and one event, and returns the
next state and one decision; :func:`roles.edge.launcher.launcher.supervise` is the shell that reads the
marker, runs the agent, sleeps and rolls back as told. The events alternate: :class:`Starting`
(the marker before a start) and, after a :class:`Start`, :class:`Exited` (how the agent ended and
the marker after it). Any other decision is followed by :class:`Starting` again.

The rules (the launcher's module docstring tells them from the device's side):

* a marker saying ``unhealthy`` is rolled back before anything starts;
* a marker saying ``switched`` puts the start on probation: the new version must turn the marker
  ``healthy`` before ``deadline_s + grace`` has passed since the first start of that switch (restarts
  of the same switch do not extend it);
* a run on probation that was stopped at its deadline, or the :data:`MAX_FAILED_STARTS`-th exit in
  a row of that switch that was not a restart request, is rolled back;
* a restart request (:data:`roles.common.restart.EXIT_RESTART`) relaunches at once and is never a failed
  start, on probation or not (a config update restoring its backup restarts this way too);
* off probation, a clean exit or a configuration error ends the launcher with that status, and any
  other exit relaunches after the crash backoff.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Final

from roles.common.restart import EXIT_RESTART
from roles.edge.upgrade.marker import MarkerState, UpgradeMarker

__all__ = [
    "DEADLINE_GRACE_S",
    "EXIT_USAGE",
    "MAX_FAILED_STARTS",
    "Decision",
    "Event",
    "Exited",
    "Finish",
    "Pause",
    "Probation",
    "Relaunch",
    "RollBack",
    "Start",
    "Starting",
    "Supervision",
    "decide",
]

MAX_FAILED_STARTS: Final = 3
DEADLINE_GRACE_S: Final = 5.0
"""Added to the marker's deadline: the new agent's own health check should time out first, with its reason."""
EXIT_USAGE: Final = 2


@dataclass(frozen=True, slots=True)
class Probation:
    """A switch to a new version being judged: its job and the loop time by which it must be healthy."""

    job_uid: str
    until: float


@dataclass(frozen=True, slots=True)
class Supervision:
    """The launcher's state between events."""

    grace: float = DEADLINE_GRACE_S
    probation: Probation | None = None
    """The latest switch put on probation (kept after it ends, so that its deadline is never restarted)."""
    failed_starts: int = 0
    """Exits of the agent on probation, in a row, that were not restart requests."""
    run_on_probation: bool = False
    """Whether the last start was on probation."""


@dataclass(frozen=True, slots=True)
class Starting:
    """The agent is about to be started: the marker as it is now, and the loop time."""

    marker: UpgradeMarker | None
    now: float


@dataclass(frozen=True, slots=True)
class Exited:
    """The agent ended: its exit status (None: stopped for missing its probation's deadline) and the marker then."""

    status: int | None
    marker: UpgradeMarker | None


Event = Starting | Exited


class Pause(StrEnum):
    """How long to wait before the next start."""

    NONE = "none"
    """A restart request: at once, and the crash backoff starts over."""
    RETRY = "retry"
    """A failed start on probation: a short pause."""
    BACKOFF = "backoff"
    """A crash: the next delay of the capped crash backoff."""


@dataclass(frozen=True, slots=True)
class Start:
    """Start the agent; ``until`` is the loop time its probation ends (None: not on probation)."""

    until: float | None


@dataclass(frozen=True, slots=True)
class RollBack:
    """Point ``current`` back at ``marker.previous`` and mark the upgrade rolled back with ``reason``."""

    marker: UpgradeMarker
    reason: str


@dataclass(frozen=True, slots=True)
class Relaunch:
    """Start the agent again after ``pause``."""

    pause: Pause


@dataclass(frozen=True, slots=True)
class Finish:
    """The launcher ends with ``status``."""

    status: int


Decision = Start | RollBack | Relaunch | Finish


def _switched(marker: UpgradeMarker | None) -> UpgradeMarker | None:
    return marker if marker is not None and marker.state is MarkerState.SWITCHED else None


def decide(state: Supervision, event: Event) -> tuple[Supervision, Decision]:
    """The next state and what to do, given what just happened. Pure."""
    if isinstance(event, Starting):
        return _starting(state, event)
    return _exited(state, event)


def _starting(state: Supervision, event: Starting) -> tuple[Supervision, Decision]:
    marker = event.marker
    if marker is not None and marker.state is MarkerState.UNHEALTHY:
        return state, RollBack(marker, marker.reason or f"{marker.to_version} reported itself unhealthy")
    switched = _switched(marker)
    if switched is None:
        return replace(state, run_on_probation=False), Start(None)
    probation = state.probation
    failed_starts = state.failed_starts
    if probation is None or probation.job_uid != switched.job_uid:
        probation = Probation(switched.job_uid, event.now + switched.deadline_s + state.grace)
        failed_starts = 0
    state = replace(state, probation=probation, failed_starts=failed_starts, run_on_probation=True)
    return state, Start(probation.until)


def _exited(state: Supervision, event: Exited) -> tuple[Supervision, Decision]:
    status = event.status
    # Still on probation: the run started on it and the new version has not judged itself since.
    switched = _switched(event.marker) if state.run_on_probation else None
    if status is None and switched is not None:
        return state, RollBack(
            switched, f"{switched.to_version} did not report healthy within {switched.deadline_s:g}s"
        )
    if status == EXIT_RESTART:
        return state, Relaunch(Pause.NONE)
    if switched is not None:
        failed = state.failed_starts + 1
        state = replace(state, failed_starts=failed)
        if failed >= MAX_FAILED_STARTS:
            reason = f"{switched.to_version} exited with status {status} {failed} times before it was healthy"
            return state, RollBack(switched, reason)
        return state, Relaunch(Pause.RETRY)
    if status in (0, EXIT_USAGE):
        return state, Finish(status or 0)
    return state, Relaunch(Pause.BACKOFF)
