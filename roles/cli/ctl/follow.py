"""``ctl watch``'s bookkeeping: what changed with each watch event, and when the watch is over.

Pure: :func:`on_job` and :func:`on_event` return a new :class:`WatchState` and what to report;
:func:`outcome` says whether every watched job is final and how the command exits (0 when every
one Completed, 1 when any ended in Failure or was deleted). The I/O is in ``roles.cli.ctl.watch``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from nodetask.phases import JobPhase
from roles.cli.ctl.views import EventRow, JobSummary

__all__ = ["EVENTS_KEPT", "WatchState", "on_event", "on_job", "outcome"]

EVENTS_KEPT: Final = 5
"""Latest Events the live view shows."""


@dataclass(frozen=True, slots=True)
class WatchState:
    jobs: Mapping[str, JobSummary | None]
    """By ``kind/name``: the latest summary, None before the first one arrives."""
    deleted: frozenset[str] = frozenset()
    events: tuple[EventRow, ...] = ()
    """The latest :data:`EVENTS_KEPT` Events about the watched jobs, oldest first."""
    seen: frozenset[tuple[str, str, int]] = frozenset()
    """Events reported, by (object, name, count): a repeated Event counts again."""

    @classmethod
    def start(cls, refs: Iterable[str]) -> WatchState:
        return cls(jobs=MappingProxyType(dict.fromkeys(refs)))


def on_job(state: WatchState, ref: str, job: JobSummary | None) -> tuple[WatchState, bool]:
    """The state after ``ref`` changed to ``job`` (None: deleted), and whether anything shown changed.

    Only what a person sees counts as a change (phase, reason, counts), not a new resourceVersion.
    """
    if job is None:
        if ref in state.deleted:
            return state, False
        return dataclasses.replace(state, deleted=state.deleted | {ref}), True
    before = state.jobs.get(ref)
    changed = before is None or (before.phase, before.reason, before.total, before.counts) != (
        job.phase,
        job.reason,
        job.total,
        job.counts,
    )
    jobs = MappingProxyType({**state.jobs, ref: job})
    return dataclasses.replace(state, jobs=jobs, deleted=state.deleted - {ref}), changed


def on_event(state: WatchState, name: str, event: EventRow) -> tuple[WatchState, bool]:
    """The state after Event ``name`` (as ``event``) arrived, and whether it is new."""
    key = (event.object, name, event.count)
    if key in state.seen:
        return state, False
    events = tuple(sorted((*state.events, event), key=lambda e: e.time))[-EVENTS_KEPT:]
    return dataclasses.replace(state, events=events, seen=state.seen | {key}), True


def outcome(state: WatchState) -> int | None:
    """None while a watched job can still change; then 0 if every one Completed, else 1."""
    for ref, job in state.jobs.items():
        if ref not in state.deleted and (job is None or not job.final):
            return None
    every = all(
        ref not in state.deleted and job is not None and job.phase == JobPhase.COMPLETED
        for ref, job in state.jobs.items()
    )
    return 0 if every else 1
