"""A diagnosis Task on its hub: the RunAction a hub sends for it, and the hub's writes to its status.

The hub's writes to a Task's status are the pure changes below, each ``task -> (task or None,
outcome)`` for the coalescing status writer, which may apply them again to a fresher copy after a
conflict. None of them moves a Task out of a final phase: a result that arrives after the
controller declared the Task Unknown is acknowledged and dropped, never resurrects it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Final

import msgspec

from flows.diagnosis.conditions import find_condition, set_condition
from flows.diagnosis.job import RESOURCE_TYPE, TaskRun, decode_results
from flows.diagnosis.tasks import is_final, request_data
from flows.nodejobs.jobtype import ExtendError
from nodetask.clock import format_time
from nodetask.messages import ActionResult
from nodetask.names import clip
from nodetask.phases import ConditionStatus
from nodetask.route import Route
from schemas.diagnosis.v1 import API_VERSION, Condition, Task, TaskConditionType, TaskPhase
from schemas.processors import Processor

__all__ = [
    "DIAGNOSIS_NOT_FOUND",
    "OPERATION_NOT_FOUND",
    "REQUEST_TOO_LARGE",
    "Recorded",
    "TaskChange",
    "accepted",
    "failed",
    "finished",
    "route_of",
    "sent",
    "task_run",
]

MAX_MESSAGE: Final = 2048
"""Characters of a reported reason kept in a condition's message."""

# Condition reasons a hub writes.
STORED: Final = "TaskStored"
SUCCEEDED: Final = "TaskSucceeded"
PROCESSOR_FAILED: Final = "ProcessorFailed"
RESULTS_INVALID: Final = "ResultsInvalid"
RESULTS_TOO_LARGE: Final = "ResultsTooLarge"
REQUEST_TOO_LARGE: Final = "RequestTooLarge"
DIAGNOSIS_NOT_FOUND: Final = "DiagnosisNotFound"
OPERATION_NOT_FOUND: Final = TaskConditionType.OPERATION_NOT_FOUND.value


def route_of(task: Task) -> Route:
    """The route of ``task`` on its node. Errors: ``RouteError`` for a Task without a valid node name."""
    return Route(API_VERSION, RESOURCE_TYPE, task.metadata.name, task.spec.node_name)


def task_run(task: Task, processor: Processor, parameters: Mapping[str, str] | None = None) -> bytes:
    """The encoded :class:`TaskRun` of ``task``, whose Operation has ``processor`` and whose Diagnosis has
    ``parameters`` (None for a Task no Diagnosis owns). The request is
    :func:`flows.diagnosis.tasks.request_data` with ``task.uid``: the same for a Task that carries its
    Diagnosis's parameters itself (an older controller's) as for one that does not."""
    request = {**request_data(parameters or {}, task.spec.parameters), "task.uid": task.metadata.uid}
    run = TaskRun(
        namespace=task.metadata.namespace,
        name=task.metadata.name,
        operation=task.spec.operation,
        processor=processor,
        request=request,
    )
    return msgspec.json.encode(run)


class Recorded(enum.StrEnum):
    """What became of a change to a Task's status."""

    APPLIED = "applied"
    UNCHANGED = "unchanged"
    """Nothing to do: already so."""
    FINAL = "final"
    """The Task had already ended (a late result, or the controller's Unknown came first)."""
    REPLACED = "replaced"
    """The object is another Task of the same name, created after the one the change was for."""


TaskChange = Callable[[Task], tuple[Task | None, Recorded]]


def _guarded(uid: str, apply: Callable[[Task], Task | None]) -> TaskChange:
    def change(task: Task) -> tuple[Task | None, Recorded]:
        if task.metadata.uid != uid:
            return None, Recorded.REPLACED
        if is_final(task.status.phase):
            return None, Recorded.FINAL
        new = apply(task)
        return (None, Recorded.UNCHANGED) if new is None or new == task else (new, Recorded.APPLIED)

    return change


def _with(task: Task, **status: Any) -> Task:
    return msgspec.structs.replace(task, status=msgspec.structs.replace(task.status, **status))


def _accepted(task: Task, node: str, now: datetime) -> tuple[Condition, ...]:
    found = find_condition(task.status.conditions, TaskConditionType.ACCEPTED.value)
    if found is not None and found.status is ConditionStatus.TRUE:
        return task.status.conditions
    condition = Condition(
        type=TaskConditionType.ACCEPTED.value,
        status=ConditionStatus.TRUE,
        reason=STORED,
        message=f"node {node} has stored the task",
    )
    return set_condition(task.status.conditions, condition, now)


def sent(*, uid: str, now: datetime) -> TaskChange:
    """The hub sent the Task to its node: ``startTime`` (from which the controller's timeout counts) and Pending."""

    def apply(task: Task) -> Task | None:
        if task.status.start_time:
            return None
        phase = task.status.phase if task.status.phase is not TaskPhase.NONE else TaskPhase.PENDING
        return _with(task, start_time=format_time(now), phase=phase)

    return _guarded(uid, apply)


def accepted(*, uid: str, node: str, now: datetime) -> TaskChange:
    """The node acknowledged the Task (it is stored there): Running, with Accepted."""

    def apply(task: Task) -> Task | None:
        return _with(
            task,
            phase=TaskPhase.RUNNING,
            conditions=_accepted(task, node, now),
            start_time=task.status.start_time or format_time(now),
        )

    return _guarded(uid, apply)


def failed(*, uid: str, reason: str, message: str, now: datetime, condition_type: str = "") -> TaskChange:
    """The Task failed with ``reason``, and also a condition of ``condition_type`` (e.g. OperationNotFound)."""

    def apply(task: Task) -> Task | None:
        conditions = task.status.conditions
        for kind in (TaskConditionType.FAILED.value, condition_type):
            if kind:
                condition = Condition(
                    type=kind, status=ConditionStatus.TRUE, reason=reason, message=clip(message, MAX_MESSAGE)
                )
                conditions = set_condition(conditions, condition, now)
        return _with(task, phase=TaskPhase.FAILED, conditions=conditions, results={})

    return _guarded(uid, apply)


def finished(result: ActionResult, *, uid: str, node: str, now: datetime) -> TaskChange:
    """A node's result of :data:`RUN`: Succeeded with its results and Complete, or Failed with its reason.

    Results that do not decode fail the Task with :data:`RESULTS_INVALID` saying why: a report is
    never refused for its content, or the edge would drop it and the Task would wait for its timeout.
    """
    if result.succ:
        try:
            results = decode_results(result.extend)
        except ExtendError as exc:
            return failed(uid=uid, reason=RESULTS_INVALID, message=f"node {node}: {exc}", now=now)
        ending = Condition(type=TaskConditionType.COMPLETE.value, status=ConditionStatus.TRUE, reason=SUCCEEDED)
    else:
        results = {}
        ending = Condition(
            type=TaskConditionType.FAILED.value,
            status=ConditionStatus.TRUE,
            reason=PROCESSOR_FAILED,
            message=clip(result.reason or f"action {result.action} failed", MAX_MESSAGE),
        )
    phase = TaskPhase.SUCCEEDED if result.succ else TaskPhase.FAILED

    def apply(task: Task) -> Task | None:
        conditions = set_condition(_accepted(task, node, now), ending, now)
        return _with(task, phase=phase, conditions=conditions, results=results)

    return _guarded(uid, apply)
