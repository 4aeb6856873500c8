"""A Diagnosis run as a pure state machine: from what the controller sees to what it writes next.

:func:`start` takes a new Diagnosis and its resolved targets; :func:`advance` takes a running one,
its OperationSet's compiled paths (:mod:`flows.diagnosis.pipeline`), the Operations and the
Diagnosis's Tasks, and returns a :class:`Step`: the status to write, the Tasks to create, the
Tasks to declare Unknown, the Events to record and when to look again. Nothing here reads a clock
or the API; ``roles.controller.diagnoses`` does the I/O, and is the only writer of a Diagnosis's
status (KubeDiag's agents race each other on it). A running Diagnosis's stages are walked by
:mod:`flows.diagnosis.stages`; :mod:`flows.diagnosis.step` holds what a decision reads and returns.

The run fails with ``OperationSetChanged`` when the OperationSet's graph no longer has the hash
stamped on the Diagnosis when it started, ``OperationSetNotFound`` or ``OperationSetNotReady``
when there is none or it cannot run, with ``NoTargets`` when its targets select no node, and
before any Task with ``TooManyTargets`` or ``ParametersTooLarge`` when it has more targets or
parameters than a Diagnosis may (what the webhook refuses; checked again here for one stored while
the webhook was away).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Final

import msgspec

from flows.diagnosis.conditions import set_condition
from flows.diagnosis.pipeline import HASH_LABEL, BrokenGraph, Pipeline
from flows.diagnosis.size import (
    MAX_ANNOTATIONS_BYTES,
    STATUS_TOO_LARGE,
    context_room,
    object_bytes,
    reserve,
    shrunk,
    too_large_message,
)
from flows.diagnosis.stages import PODS_ANNOTATION, StageWalk
from flows.diagnosis.step import FINAL_PHASES, Notice, Step, World, after_finish, finish
from flows.diagnosis.targets import Resolution, listed
from nodetask.clock import format_time, parse_time
from nodetask.phases import ConditionStatus
from schemas.diagnosis.v1 import (
    MAX_PARAMETERS_BYTES,
    Checkpoint,
    Condition,
    Diagnosis,
    DiagnosisConditionType,
    DiagnosisContext,
    DiagnosisPhase,
    DiagnosisStatus,
    parameters_bytes,
)

__all__ = [
    "OPERATION_SET_GRACE",
    "advance",
    "awaiting_operation_set",
    "fail_too_large",
    "parameters_problem",
    "progress_only",
    "start",
]

OPERATION_SET_GRACE: Final = timedelta(seconds=30)
"""How long a new Diagnosis waits for an OperationSet that is not there, before failing with
OperationSetNotFound: ``kubectl apply`` of one file creates its objects one by one, in the file's
order, so a Diagnosis may be seen a moment before the OperationSet applied with it."""

ACCEPTED: Final = DiagnosisConditionType.ACCEPTED.value
NO_TARGETS: Final = "NoTargets"
TOO_MANY_TARGETS: Final = "TooManyTargets"
PARAMETERS_TOO_LARGE: Final = "ParametersTooLarge"


def awaiting_operation_set(diagnosis: Diagnosis, world: World) -> datetime | None:
    """Until when a new Diagnosis waits for its OperationSet, which is not there yet; None: decide now.

    Only an OperationSet that does not exist is waited for (one that does not decode or cannot run
    fails the Diagnosis at once), and only :data:`OPERATION_SET_GRACE` after the Diagnosis was created.
    """
    if world.pipeline is not None or not diagnosis.metadata.creation_timestamp:
        return None
    try:
        until = parse_time(diagnosis.metadata.creation_timestamp) + OPERATION_SET_GRACE
    except ValueError:
        return None
    return until if world.now < until else None


def parameters_problem(diagnosis: Diagnosis) -> str | None:
    """Why a Diagnosis's parameters keep it from running (more than the webhook admits), or None."""
    size = parameters_bytes(diagnosis.spec.parameters)
    if size <= MAX_PARAMETERS_BYTES:
        return None
    return f"spec.parameters take {size} bytes as JSON, more than the {MAX_PARAMETERS_BYTES} a Diagnosis's may"


def start(diagnosis: Diagnosis, world: World, targets: Resolution) -> Step:
    """The first step of a new Diagnosis: Running on the resolved targets, or Failed saying why."""
    problem = _pipeline_problem(diagnosis, world.pipeline)
    if problem is not None:
        return finish(diagnosis, diagnosis.status, DiagnosisPhase.FAILED, *problem, now=world.now)
    too_large = parameters_problem(diagnosis)
    if too_large is not None:
        return _refuse(diagnosis, PARAMETERS_TOO_LARGE, too_large, now=world.now)
    if not targets.nodes:
        reason = TOO_MANY_TARGETS if targets.too_many else NO_TARGETS
        return _refuse(diagnosis, reason, targets.empty_reason, now=world.now)
    assert isinstance(world.pipeline, Pipeline)
    count = len(targets.nodes)
    message = f"{count} target node{'' if count == 1 else 's'}"
    if targets.skipped:
        message += f"; left out: {listed(targets.skipped)}"
    accepted = Condition(type=ACCEPTED, status=ConditionStatus.TRUE, reason="TargetsResolved", message=message)
    status = DiagnosisStatus(
        phase=DiagnosisPhase.RUNNING,
        conditions=set_condition(diagnosis.status.conditions, accepted, world.now),
        start_time=format_time(world.now),
        node_names=targets.nodes,
        checkpoint=Checkpoint(desired=count, active=count),
        context=DiagnosisContext(parameters=dict(diagnosis.spec.parameters)),
    )
    pods = {PODS_ANNOTATION: msgspec.json.encode(dict(targets.pods)).decode()} if targets.pods else {}
    notices = [Notice("Normal", "DiagnosisRunning", f"OperationSet {diagnosis.spec.operation_set} on {message}")]
    step = Step(
        status=status,
        labels=MappingProxyType({HASH_LABEL: world.pipeline.hash}),
        annotations=MappingProxyType(pods),
        notices=tuple(notices),
    )
    started = _stamped(diagnosis, step)
    too_large = _start_too_large(started, world.pipeline, world.object_limit)
    if too_large is not None:
        return _refuse(diagnosis, STATUS_TOO_LARGE, too_large, now=world.now)
    return step


def _refuse(diagnosis: Diagnosis, reason: str, message: str, *, now: datetime) -> Step:
    """A new Diagnosis that cannot run: Accepted False and Failed, both with ``reason`` and ``message``."""
    refused = Condition(type=ACCEPTED, status=ConditionStatus.FALSE, reason=reason, message=message)
    base = msgspec.structs.replace(
        diagnosis.status,
        start_time=format_time(now),
        conditions=set_condition(diagnosis.status.conditions, refused, now),
    )
    return finish(diagnosis, base, DiagnosisPhase.FAILED, reason, message, now=now)


def _stamped(diagnosis: Diagnosis, step: Step) -> Diagnosis:
    """``diagnosis`` as ``step`` leaves it: its labels and annotations set, its status written."""
    meta = diagnosis.metadata
    if step.labels or step.annotations:
        meta = msgspec.structs.replace(
            meta, labels={**meta.labels, **step.labels}, annotations={**meta.annotations, **step.annotations}
        )
    return msgspec.structs.replace(diagnosis, metadata=meta, status=step.status)


def _start_too_large(started: Diagnosis, pipeline: Pipeline, limit: int) -> str | None:
    """Why a run cannot start on these targets for its size, or None: its status must fit with every path
    failed and every node counted, and the pods it records must fit in the annotations Kubernetes allows."""
    annotations = sum(len(k) + len(v) for k, v in started.metadata.annotations.items())
    if annotations > MAX_ANNOTATIONS_BYTES:
        pods = started.metadata.annotations.get(PODS_ANNOTATION, "")
        return (
            f"the pods of its {len(started.status.node_names)} target nodes take {len(pods)} bytes in the"
            f" annotation {PODS_ANNOTATION}, and a Diagnosis's annotations may take at most"
            f" {MAX_ANNOTATIONS_BYTES} bytes in all"
        )
    if context_room(started, paths_bytes=pipeline.paths_bytes, limit=limit) >= 0:
        return None
    size = object_bytes(started) + reserve(pipeline.paths_bytes, len(started.status.node_names))
    return too_large_message(started, size=size, limit=limit)


def advance(diagnosis: Diagnosis, world: World) -> Step:
    """The next step of a started Diagnosis (see the module docstring); its own status if nothing changes.

    Deciding again on the status a step wrote gives that status back: a step is idempotent, which
    is what lets a write be retried on a fresh copy, and a new leader resume.
    """
    status = diagnosis.status
    if status.phase in FINAL_PHASES:
        return after_finish(diagnosis, world.now)
    if status.phase in (DiagnosisPhase.NONE, DiagnosisPhase.PENDING):
        return Step(status=status)  # not started: start() decides
    problem = _pipeline_problem(diagnosis, world.pipeline)
    if problem is not None:
        return finish(diagnosis, status, DiagnosisPhase.FAILED, *problem, now=world.now)
    pipeline = world.pipeline
    assert isinstance(pipeline, Pipeline)
    if diagnosis.metadata.labels.get(HASH_LABEL) != pipeline.hash:
        message = (
            f"OperationSet {diagnosis.spec.operation_set}'s specification has been changed during diagnosis execution"
        )
        return finish(
            diagnosis,
            status,
            DiagnosisPhase.FAILED,
            DiagnosisConditionType.OPERATION_SET_CHANGED.value,
            message,
            now=world.now,
        )
    nodes = status.node_names
    if not nodes:
        return finish(diagnosis, status, DiagnosisPhase.FAILED, NO_TARGETS, "status.nodeNames is empty", now=world.now)
    return _bounded(diagnosis, StageWalk(diagnosis, world, pipeline).walk(), world)


def _bounded(diagnosis: Diagnosis, step: Step, world: World) -> Step:
    """``step``, or the run ended by :func:`fail_too_large` if the status it writes would not fit.

    The run's bounds keep the status within ``world.object_limit``; this is the check that they did.
    """
    if step.status == diagnosis.status:
        return step
    after = _stamped(diagnosis, step)
    size = object_bytes(after)
    if size <= world.object_limit:
        return step
    return fail_too_large(after, too_large_message(after, size=size, limit=world.object_limit), now=world.now)


def fail_too_large(diagnosis: Diagnosis, message: str, *, now: datetime) -> Step:
    """``diagnosis`` ends Failed with ``StatusTooLarge`` and ``message``: its status as it is but without
    what made it too large (:func:`flows.diagnosis.size.shrunk`), so that this one can be written."""
    return finish(diagnosis, shrunk(diagnosis.status), DiagnosisPhase.FAILED, STATUS_TOO_LARGE, message, now=now)


def progress_only(status: DiagnosisStatus, step: Step) -> bool:
    """Whether ``step`` (decided on ``status``) only counts more ended Tasks of the same stage, with their
    results: no other change of the status, no Event, the stage still waiting for some Tasks.

    Such a status need not be written at once: deciding again later, from the same Tasks, gives it (or a
    later one) back, so the controller may hold it back and write the progress of many Tasks at once.
    """
    new = step.status
    if step.notices or step.delete or status.checkpoint is None or new.checkpoint is None:
        return False
    was, now = status.checkpoint, new.checkpoint
    if (was.path_index, was.node_index) != (now.path_index, now.node_index) or now.active == 0:
        return False
    rest = msgspec.structs.replace(status, checkpoint=None, context=None)
    return rest == msgspec.structs.replace(new, checkpoint=None, context=None)


def _pipeline_problem(diagnosis: Diagnosis, pipeline: Pipeline | BrokenGraph | None) -> tuple[str, str] | None:
    name = diagnosis.spec.operation_set
    if pipeline is None:
        return DiagnosisConditionType.OPERATION_SET_NOT_FOUND.value, f"OperationSet {name} is not found"
    if isinstance(pipeline, BrokenGraph):
        message = f"OperationSet {name} cannot run: {pipeline.message}"
        return DiagnosisConditionType.OPERATION_SET_NOT_READY.value, message
    return None
