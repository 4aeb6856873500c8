"""The status changes a cloud hub makes to a job, as pure functions over immutable job objects.

A hub owns a node entry from the moment it claims it for dispatch: the claim itself (Pending ->
InProgress with ``dispatchTime``) and every reported result after it. Each change is a function
``job -> (job or None, outcome)`` so that the status writer can apply several of them to one fresh
copy of the job, write once, and re-apply all of them after a conflict.

Claims are what make a job's ``concurrency`` hold across several hub instances: a claim succeeds
only while fewer than ``concurrency`` nodes of the job are InProgress *in the object being
written*, and the write is conditional on that object's resourceVersion. Two hubs can therefore
never both take the last free slot (KubeEdge counts concurrency per CloudCore instance).
"""

from __future__ import annotations

import enum
import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from flows.nodejobs import nodeupgradejob
from flows.nodejobs.jobtype import ExtendError, JobType, apply_result, compact
from nodetask.flow import UnknownActionError
from nodetask.messages import ActionResult
from nodetask.phases import ConditionStatus, JobPhase, NodeTaskPhase
from schemas.access import targeting
from schemas.core import CONFIRM_ANNOTATION

__all__ = [
    "Change",
    "ClaimOutcome",
    "RecordOutcome",
    "awaits_confirmation",
    "claim",
    "dispatchable",
    "full",
    "record",
    "refuse",
]

Job = Any
"""A v1alpha2 job object of any kind (their Structs share the fields used here)."""

Change = Callable[[Job], tuple[Job | None, Any]]
"""A pure status change: the new job (None: unchanged) and an outcome for whoever asked."""


class ClaimOutcome(enum.StrEnum):
    """What became of a claim to dispatch one node."""

    CLAIMED = "claimed"
    FULL = "full"
    """Every concurrency slot of the job is taken (by this hub or another); try again once one frees."""
    TAKEN = "taken"
    """The node is no longer Pending: another hub claimed it or the controller ended it."""
    GONE = "gone"
    """The job is not the one the claim was for (deleted, re-created) or no longer runs."""


@dataclass(frozen=True, slots=True)
class RecordOutcome:
    """What became of a reported result. ``error`` is set when it can never be applied."""

    applied: bool
    error: str = ""
    other_attempt: int = 0
    """The node's current attempt, when the report was for another one (a late report of an attempt
    before a retry): acknowledged, and nothing changes."""

    @property
    def acknowledge(self) -> bool:
        """The edge may forget the report: it is recorded (now or before)."""
        return not self.error


_PHASE = operator.attrgetter("phase")

RUNNING = frozenset({JobPhase.INIT, JobPhase.IN_PROGRESS})


def awaits_confirmation(job: Job, node: str) -> bool:
    """Whether ``node`` paused after WaitingConfirmation and the job's confirm annotation releases it."""
    wanted = job.metadata.annotations.get(CONFIRM_ANNOTATION, "")
    names = {n.strip() for n in wanted.split(",")}
    if not wanted or not ("*" in names or node in names):
        return False
    index = _index(job, node)
    if index < 0:
        return False
    entry = job.status.node_status[index]
    flow = entry.action_flow
    return (
        entry.phase is NodeTaskPhase.IN_PROGRESS
        and bool(flow)
        and flow[-1].action == nodeupgradejob.WAITING_CONFIRMATION
        and flow[-1].status is ConditionStatus.TRUE
    )


def dispatchable(job: Job) -> bool:
    """Whether hubs dispatch ``job``'s nodes: it is initialised and not finished."""
    return job.status.phase in RUNNING


def _index(job: Job, node: str) -> int:
    entries = job.status.node_status
    positions = _layout(job.metadata.uid, len(entries))
    i = positions.get(node, -1)
    if i < 0 and len(positions) == len(entries):
        return -1  # every entry is mapped already: the job has none for this node
    if i < 0 or entries[i].node_name != node:
        # First sight of this job, or (never in practice) another layout under the same key.
        positions.clear()
        positions.update((entry.node_name, i) for i, entry in enumerate(entries))
        i = positions.get(node, -1)
    return i


@functools.lru_cache(maxsize=256)
def _layout(uid: str, count: int) -> dict[str, int]:
    """Where each node's entry is in the status of job ``uid``, filled by :func:`_index`.

    Every change looks its node up in a fresh copy of the job, but the controller lays a job's
    entries out once and they never move, so one map per job serves every copy: a scan of
    thousands of entries per change was a large part of a big job's hub time (docs/benchmarks.md).
    """
    return {}


def _with_entry(job: Job, index: int, entry: Any) -> Job:
    entries = list(job.status.node_status)
    entries[index] = entry
    return msgspec.structs.replace(job, status=msgspec.structs.replace(job.status, node_status=tuple(entries)))


def full(job: Job) -> bool:
    """Whether every concurrency slot of ``job`` is taken: as many nodes InProgress as its concurrency allows."""
    # Every claim counts the whole job: in C (map, list.count), a quarter of a generator's time.
    running = list(map(_PHASE, job.status.node_status)).count(NodeTaskPhase.IN_PROGRESS)
    return running >= targeting(job).effective_concurrency


def claim(node: str, *, uid: str, now: str) -> Change:
    """Take ``node`` of job ``uid`` for dispatch at ``now`` if a concurrency slot is free."""

    def change(job: Job) -> tuple[Job | None, ClaimOutcome]:
        if job.metadata.uid != uid or not dispatchable(job):
            return None, ClaimOutcome.GONE
        index = _index(job, node)
        if index < 0:
            return None, ClaimOutcome.GONE
        entry = job.status.node_status[index]
        if entry.phase is not NodeTaskPhase.PENDING:
            return None, ClaimOutcome.TAKEN
        if full(job):
            return None, ClaimOutcome.FULL
        claimed = msgspec.structs.replace(entry, phase=NodeTaskPhase.IN_PROGRESS, reason="", dispatch_time=now)
        return _with_entry(job, index, claimed), ClaimOutcome.CLAIMED

    return change


def refuse(node: str, *, uid: str, attempt: int, reason: str) -> Change:
    """Fail ``node``'s Pending ``attempt`` of job ``uid`` with ``reason`` instead of dispatching it.

    For a node that cannot run it (its agent cannot tell a retry from a re-delivered first attempt);
    the outcome says whether it was refused (False: the node was no longer that Pending attempt).
    """

    def change(job: Job) -> tuple[Job | None, bool]:
        if job.metadata.uid != uid or not dispatchable(job):
            return None, False
        index = _index(job, node)
        if index < 0:
            return None, False
        entry = job.status.node_status[index]
        if entry.phase is not NodeTaskPhase.PENDING or entry.attempt != attempt:
            return None, False
        failed = msgspec.structs.replace(entry, phase=NodeTaskPhase.FAILURE, reason=reason)
        return _with_entry(job, index, failed), True

    return change


def record(
    job_type: JobType,
    node: str,
    result: ActionResult,
    *,
    uid: str,
    now: str,
    compact_above: int | None = None,
    attempt: int = 0,
) -> Change:
    """Record ``result`` of ``node``'s ``attempt`` of job ``uid``; a duplicate is recognised and changes nothing.

    A result of another attempt than the node's current one (a late report of the attempt before a
    retry) changes nothing either; ``attempt`` 0 (an agent that knows no attempts) is the current one.
    In a job of more than ``compact_above`` nodes, a node that succeeds keeps a compact entry
    (:func:`flows.nodejobs.jobtype.compact`); a report that only restores what compaction left out (a
    redelivered earlier action) is a duplicate too.
    """

    def change(job: Job) -> tuple[Job | None, RecordOutcome]:
        if job.metadata.uid != uid:
            return None, RecordOutcome(applied=False, error=f"job {job.metadata.name} was re-created")
        index = _index(job, node)
        if index < 0:
            return None, RecordOutcome(applied=False, error=f"node {node} is not a target of this job")
        current = job.status.node_status[index].attempt
        if attempt and attempt != current:
            return None, RecordOutcome(applied=False, other_attempt=current)
        try:
            entry = apply_result(job_type, job.status.node_status[index], result, now=now)
        except (UnknownActionError, ExtendError) as exc:
            return None, RecordOutcome(applied=False, error=str(exc))
        if entry is not None and compact_above is not None and len(job.status.node_status) > compact_above:
            entry = compact(job_type, entry)
            if entry == job.status.node_status[index]:
                entry = None
        if entry is None:
            return None, RecordOutcome(applied=False)
        return _with_entry(job, index, entry), RecordOutcome(applied=True)

    return change
