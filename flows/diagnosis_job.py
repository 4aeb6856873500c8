"""A diagnosis Task as a job type: how a hub sends it to its node, and what comes back.

Route ``diagnosis.kubediag.org/v1/task/<task>/nodes/<node>``, the RunAction's job UID is the Task's
uid, and its flow has one action, :data:`RUN`, which runs the Operation's processor on the Task's
request data. The RunAction's spec is a :class:`TaskRun`: the processor as the hub read it from the
Operation when it dispatched the Task, the request data (``spec.parameters`` plus ``task.uid``,
which only exists once the Task does), and the Task's namespace, which the route cannot carry. A
report's ``extend`` is the results, a JSON object of strings.

Both directions are bounded so that nothing is stuck on a link that cannot carry it: a request over
:data:`MAX_REQUEST_BYTES` is not sent (the Task fails with :data:`REQUEST_TOO_LARGE`), and results over
:data:`MAX_RESULTS_BYTES` are not reported as such (the edge reports a failure saying so).

The hub's writes to a Task's status are the pure changes below, each ``task -> (task or None,
outcome)`` for the coalescing status writer, which may apply them again to a fresher copy after a
conflict. None of them moves a Task out of a final phase: a result that arrives after the
controller declared the Task Unknown is acknowledged and dropped, never resurrects it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import msgspec

from flows.diagnosis_conditions import find_condition, set_condition
from flows.jobtype import ExtendError
from nodetask import nesting
from nodetask.clock import format_time
from nodetask.flow import Flow, Step
from nodetask.messages import ActionResult
from nodetask.names import clip
from nodetask.phases import ConditionStatus
from nodetask.route import Route
from schemas.diagnosis import API_VERSION, Condition, Processor, Task, TaskConditionType, TaskPhase

__all__ = [
    "JOB_TYPE",
    "MAX_REQUEST_BYTES",
    "MAX_RESULTS_BYTES",
    "RESOURCE_TYPE",
    "RUN",
    "Recorded",
    "TaskJobType",
    "TaskRun",
    "accepted",
    "decode_results",
    "dispatched",
    "encode_results",
    "failed",
    "finished",
    "route_of",
    "task_run",
]

RESOURCE_TYPE: Final = "task"
RUN: Final = "Run"
FLOW: Final = Flow(name=RESOURCE_TYPE, first=RUN, steps={RUN: Step()})

MAX_RESULTS_BYTES: Final = 256 * 1024
"""Longest ``extend`` (the results as JSON). A report frame escapes it at most to twice its length, so
it stays under the hub's default frame limit of 1 MiB, and a Task's status stays far below etcd's
1.5 MiB with its request data."""
MAX_REQUEST_BYTES: Final = 768 * 1024
"""Longest :class:`TaskRun` a hub sends: a RunAction carries it as it is, and an edge takes frames of
at most 1 MiB."""
MAX_MESSAGE: Final = 2048
"""Characters of a reported reason kept in a condition's message."""

# Condition reasons a hub writes.
STORED: Final = "TaskStored"
SUCCEEDED: Final = "TaskSucceeded"
PROCESSOR_FAILED: Final = "ProcessorFailed"
RESULTS_INVALID: Final = "ResultsInvalid"
RESULTS_TOO_LARGE: Final = "ResultsTooLarge"
REQUEST_TOO_LARGE: Final = "RequestTooLarge"
OPERATION_NOT_FOUND: Final = TaskConditionType.OPERATION_NOT_FOUND.value


class TaskRun(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The spec of a Task's RunAction: what its node runs. A wire type: fields added later get defaults."""

    namespace: str
    name: str
    operation: str
    processor: Processor
    request: dict[str, str] = {}
    """The Task's ``spec.parameters`` and ``task.uid``: what the processor receives."""


@dataclass(frozen=True, slots=True)
class TaskJobType:
    """The Task's job type on the edge (see :class:`flows.jobtype.EdgeJobType`): one action, never exclusive."""

    resource_type: str = RESOURCE_TYPE
    flow: Flow = FLOW
    exclusive: bool = False
    confirmation: str | None = None
    asks_confirmation: Callable[[Any], bool] = lambda spec: False

    def read_spec(self, raw: bytes) -> tuple[msgspec.Struct | None, str]:
        """The :class:`TaskRun` a RunAction carries, or None and why it does not decode."""
        try:
            return msgspec.json.decode(raw, type=TaskRun), ""
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return None, f"the task spec is invalid: {exc}"


JOB_TYPE: Final = TaskJobType()

_RESULTS: Final = msgspec.json.Decoder(dict[str, str])
_FINAL: Final = frozenset({TaskPhase.SUCCEEDED, TaskPhase.FAILED, TaskPhase.UNKNOWN})
"""As :func:`flows.diagnosis_tasks.is_final`, which the edge does not load (its memory budget)."""


def route_of(task: Task) -> Route:
    """The route of ``task`` on its node. Errors: ``RouteError`` for a Task without a valid node name."""
    return Route(API_VERSION, RESOURCE_TYPE, task.metadata.name, task.spec.node_name)


def task_run(task: Task, processor: Processor) -> bytes:
    """The encoded :class:`TaskRun` of ``task``, whose Operation has ``processor``."""
    request = {**task.spec.parameters, "task.uid": task.metadata.uid}
    run = TaskRun(
        namespace=task.metadata.namespace,
        name=task.metadata.name,
        operation=task.spec.operation,
        processor=processor,
        request=request,
    )
    return msgspec.json.encode(run)


def encode_results(results: Mapping[str, str]) -> str:
    """The ``extend`` of a successful Run. Errors: :class:`ExtendError` when it exceeds :data:`MAX_RESULTS_BYTES`."""
    text = msgspec.json.encode(dict(results))
    if len(text) > MAX_RESULTS_BYTES:
        raise ExtendError(
            f"the results are {len(text)} bytes as JSON, more than the {MAX_RESULTS_BYTES} a task may report"
        )
    return text.decode()


def decode_results(extend: str) -> dict[str, str]:
    """The results a report carries. Errors: :class:`ExtendError` for anything but a bounded JSON object of strings."""
    if len(extend) > MAX_RESULTS_BYTES:
        raise ExtendError(f"the results are {len(extend)} characters, more than the {MAX_RESULTS_BYTES} allowed")
    if not extend:
        return {}
    try:
        nesting.check_json(extend)  # JSON inside a string: the frame's own check never saw its brackets
        return _RESULTS.decode(extend)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ExtendError(f"the results are not a JSON object of strings: {exc}") from None


# ------------------------------------------------------------------------------------------- status changes


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
        if task.status.phase in _FINAL:
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


def dispatched(*, uid: str, now: datetime) -> TaskChange:
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
