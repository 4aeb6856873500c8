"""What one decision about a Diagnosis reads (:class:`World`) and returns (:class:`Step`), and how a run ends.

:mod:`flows.diagnosis.run` starts and advances a run, :mod:`flows.diagnosis.stages` walks its stages;
both end it with :func:`finish`, which also sets what ``ttlSecondsAfterFinished`` asks of a finished
Diagnosis (:func:`after_finish`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Final

import msgspec

from flows.diagnosis.conditions import find_condition, set_condition
from flows.diagnosis.context import MAX_CONTEXT_BYTES
from flows.diagnosis.pipeline import BrokenGraph, Pipeline
from flows.diagnosis.size import MAX_OBJECT_BYTES
from nodetask.clock import format_time, parse_time
from nodetask.phases import ConditionStatus
from schemas.diagnosis.v1 import (
    Condition,
    Diagnosis,
    DiagnosisConditionType,
    DiagnosisPhase,
    DiagnosisStatus,
    Operation,
    Task,
)

__all__ = ["COMPLETE", "FINAL_PHASES", "Notice", "Step", "World", "after_finish", "finish"]

FINAL_PHASES: Final = frozenset((DiagnosisPhase.SUCCEEDED, DiagnosisPhase.FAILED, DiagnosisPhase.UNKNOWN))

COMPLETE: Final = DiagnosisConditionType.COMPLETE.value
_KUBEDIAG_CONDITIONS: Final = frozenset(
    (
        DiagnosisConditionType.OPERATION_SET_CHANGED.value,
        DiagnosisConditionType.OPERATION_SET_NOT_READY.value,
        DiagnosisConditionType.OPERATION_SET_NOT_FOUND.value,
    )
)
"""Failures KubeDiag records as a condition of their own type as well."""


@dataclass(frozen=True, slots=True)
class World:
    """What one decision about a Diagnosis reads besides the Diagnosis itself."""

    pipeline: Pipeline | BrokenGraph | None
    """The Diagnosis's OperationSet compiled; None when it does not exist."""
    operations: Mapping[str, Operation]
    tasks: Mapping[str, Task]
    """The Diagnosis's Tasks by name (those it owns)."""
    now: datetime
    context_limit: int = MAX_CONTEXT_BYTES
    """Bytes of results ``status.context`` keeps (:mod:`flows.diagnosis.context`), if the rest leaves room."""
    object_limit: int = MAX_OBJECT_BYTES
    """Bytes the Diagnosis may take with its status (:mod:`flows.diagnosis.size`)."""


@dataclass(frozen=True, slots=True)
class Notice:
    """A Kubernetes Event to record on the Diagnosis."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Step:
    """What to do next: write metadata (a start only), then the status, then create and expire Tasks."""

    status: DiagnosisStatus
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Labels to set on the Diagnosis before its status is written."""
    annotations: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    create: tuple[Task, ...] = ()
    expire: tuple[str, ...] = ()
    """Tasks past their deadline without a result: to declare Unknown, then decide again."""
    notices: tuple[Notice, ...] = ()
    due: datetime | None = None
    """When to decide again without anything changing: the next Task deadline, or the TTL."""
    delete: bool = False
    """The Diagnosis has outlived ``ttlSecondsAfterFinished``: delete it (its Tasks go with it)."""


def finish(
    diagnosis: Diagnosis, status: DiagnosisStatus, phase: DiagnosisPhase, reason: str, message: str, *, now: datetime
) -> Step:
    """``status`` ended in ``phase``, with a ``Complete`` condition (and KubeDiag's own for its reasons)."""
    conditions = status.conditions
    if reason in _KUBEDIAG_CONDITIONS:
        conditions = set_condition(
            conditions, Condition(type=reason, status=ConditionStatus.TRUE, reason=reason, message=message), now
        )
    succeeded = phase is DiagnosisPhase.SUCCEEDED
    complete = Condition(
        type=COMPLETE,
        status=ConditionStatus.TRUE if succeeded else ConditionStatus.FALSE,
        reason=reason,
        message=message,
    )
    cp = status.checkpoint
    if cp is not None:
        cp = msgspec.structs.replace(cp, active=0)
    ended = msgspec.structs.replace(
        status,
        phase=phase,
        conditions=set_condition(conditions, complete, now),
        start_time=status.start_time or format_time(now),
        checkpoint=cp,
    )
    notice = (
        Notice("Normal", "DiagnosisSucceeded", message)
        if succeeded
        else Notice("Warning", "DiagnosisFailed", f"{reason}: {message}")
    )
    step = after_finish(msgspec.structs.replace(diagnosis, status=ended), now)
    return dataclasses.replace(step, notices=(notice,))


def after_finish(diagnosis: Diagnosis, now: datetime) -> Step:
    """A finished Diagnosis waits for its ``ttlSecondsAfterFinished``, counted from when it finished."""
    status = diagnosis.status
    ttl = diagnosis.spec.ttl_seconds_after_finished
    if ttl is None:
        return Step(status=status)
    complete = find_condition(status.conditions, COMPLETE)
    finished = None
    for text in (complete.last_transition_time if complete else "", diagnosis.metadata.creation_timestamp):
        try:
            finished = parse_time(text)
            break
        except ValueError:
            continue
    if finished is None:
        return Step(status=status)
    due = finished + timedelta(seconds=ttl)
    return Step(status=status, due=None if now >= due else due, delete=now >= due)
