"""The controller's retry decision: from a job and the retry annotation's new value to its new status. Pure.

:func:`retried` answers one question for the reconciler: given the job as read from the API server,
what does its status become? The answer carries the handled value in ``status.retry``, so the
reconciler writes decision and record in one conditional status update (resourceVersion): a
controller that dies before the write leaves the value unhandled and the next one retries it once;
one that dies after finds it handled and does nothing. Whatever happens, a value triggers one retry.

The Event telling what the retry did is owed in that same update (``status.retry.pendingEvent``,
named from the job, the value and the resourceVersion decided on): the reconciler records it and
then clears it, so a controller that dies after the decision leaves the Event to the next one,
whose create of the same name shows it once even if the first had recorded it already.

What runs again: nodes in Failure or Unknown, each getting the job's next run number as its
``attempt`` and keeping how its previous attempt ended in ``previousAttempt``; Successful nodes are
untouched. Each retried node is judged again as on a first run (:func:`decide.verdict`): a node
gone, not an edge or not ready fails at once, and a NodeUpgradeJob's node already at the version
succeeds at once; the others go back to Pending, for the hubs to dispatch as on a first run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

import msgspec

from flows.nodejobs import decide
from nodetask.clock import format_time
from nodetask.job_phase import count_phases, job_phase
from nodetask.names import event_name
from nodetask.phases import NodeTaskPhase
from schemas import v1alpha2
from schemas.access import node_counts, targeting
from schemas.core import Node
from schemas.kinds import Kind
from schemas.retry import RETRIABLE_NODE_PHASES, requested_retry, retry_refusal

__all__ = ["Retried", "announced", "pending_event", "previous_attempt", "retried"]


@dataclass(frozen=True, slots=True)
class Retried:
    """A handled retry value: the new status and what became of it."""

    value: str
    status: v1alpha2.NodeJobStatus
    attempt: int
    """The job's run the retry started (unchanged when refused)."""
    pending: tuple[str, ...] = ()
    """Nodes sent back to Pending: they run again."""
    settled: tuple[str, ...] = ()
    """Retried nodes judged at once (gone, not ready, already at the version): they do not run."""
    refusal: str = ""
    """Why nothing was retried (the value is handled all the same); empty when the retry started."""

    def notice(self) -> decide.Notice:
        """The Event telling what the retry did."""
        if self.refusal:
            return decide.Notice("Warning", "RetryRefused", f"retry {self.value!r} not started: {self.refusal}")
        runs = f"{len(self.pending)} node{'s' if len(self.pending) != 1 else ''} run again"
        shown = _names(self.pending)
        message = f"attempt {self.attempt}: {runs}" + (f" ({shown})" if shown else "")
        if self.settled:
            message += f"; {len(self.settled)} judged at once ({_names(self.settled)})"
        return decide.Notice("Normal", "JobRetried", message)


def _names(names: tuple[str, ...], shown: int = 5) -> str:
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def previous_attempt(entry: v1alpha2.NodeTaskStatus, *, now: str) -> v1alpha2.PreviousAttempt:
    """How ``entry``'s attempt ended, as its retried entry keeps it."""
    last = entry.action_flow[-1] if entry.action_flow else None
    return v1alpha2.PreviousAttempt(
        attempt=entry.attempt,
        phase=entry.phase,
        action=last.action if last is not None else "",
        reason=entry.reason,
        time=(last.time if last is not None else "") or entry.dispatch_time or now,
    )


def retried(kind: Kind, job: v1alpha2.NodeJob, nodes: Mapping[str, Node], *, now: datetime) -> Retried | None:
    """What the job's status becomes for the retry annotation's value not yet handled; None when there is none."""
    status = job.status
    value = requested_retry(job.metadata.annotations, status.retry)
    if value is None:
        return None
    before = status.retry or v1alpha2.RetryStatus()
    refusal = retry_refusal(status.phase, (e.phase for e in status.node_status))
    if refusal:
        handled = msgspec.structs.replace(before, handled=value)
        refused = Retried(value, msgspec.structs.replace(status, retry=handled), before.attempt, refusal=refusal)
        return _owing(job, refused)
    attempt = before.attempt + 1
    stamp = format_time(now)
    target = decide.upgrade_target(job)
    entries: list[v1alpha2.NodeTaskStatus] = []
    pending: list[str] = []
    settled: list[str] = []
    for entry in status.node_status:
        if entry.phase not in RETRIABLE_NODE_PHASES:
            entries.append(entry)
            continue
        verdict = decide.verdict(entry.node_name, nodes.get(entry.node_name), target)
        (pending if verdict.phase is NodeTaskPhase.PENDING else settled).append(entry.node_name)
        entries.append(
            kind.node_status_type(
                node_name=entry.node_name,
                phase=verdict.phase,
                reason=verdict.reason,
                attempt=attempt,
                previous_attempt=previous_attempt(entry, now=stamp),
            )
        )
    node_status = tuple(entries)
    phase = job_phase(count_phases(e.phase for e in node_status), targeting(job).failure_tolerate)
    new = msgspec.structs.replace(
        status,
        phase=phase.phase,
        reason=phase.reason,
        node_status=node_status,
        node_counts=node_counts(node_status),
        retry=v1alpha2.RetryStatus(handled=value, attempt=attempt, time=stamp, nodes=len(pending)),
    )
    return _owing(job, Retried(value, new, attempt, pending=tuple(pending), settled=tuple(settled)))


def _owing(job: v1alpha2.NodeJob, outcome: Retried) -> Retried:
    """``outcome`` with its Event owed in the status it writes."""
    notice = outcome.notice()
    meta = job.metadata
    owed = v1alpha2.PendingEvent(
        # The resourceVersion decided on tells apart two handlings of one value (refused, then asked again).
        name=event_name(meta.name, meta.uid, meta.resource_version, outcome.value),
        type=notice.type,
        reason=notice.reason,
        message=notice.message,
    )
    retry = msgspec.structs.replace(outcome.status.retry or v1alpha2.RetryStatus(), pending_event=owed)
    return dataclasses.replace(outcome, status=msgspec.structs.replace(outcome.status, retry=retry))


def pending_event(job: v1alpha2.NodeJob) -> v1alpha2.PendingEvent | None:
    """The Event ``job``'s latest retry decision still owes, or None."""
    retry = job.status.retry
    return retry.pending_event if retry is not None else None


def announced(job: v1alpha2.NodeJob, owed: v1alpha2.PendingEvent) -> v1alpha2.NodeJob | None:
    """``job`` with ``owed`` no longer owed (it is recorded); None when it is not owed any more."""
    retry = job.status.retry
    if retry is None or retry.pending_event != owed:
        return None
    status = msgspec.structs.replace(job.status, retry=msgspec.structs.replace(retry, pending_event=None))
    return msgspec.structs.replace(job, status=status)
