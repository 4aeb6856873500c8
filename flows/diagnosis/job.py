"""A diagnosis Task as a job type on the edge: what a RunAction carries, and what a report carries back.

Route ``diagnosis.kubediag.org/v1/task/<task>/nodes/<node>``, the RunAction's job UID is the Task's
uid, and its flow has one action, :data:`RUN`, which runs the Operation's processor on the Task's
request data. The RunAction's spec is a :class:`TaskRun`: the processor as the hub read it from the
Operation when it dispatched the Task, the request data (its Diagnosis's parameters, then the
Task's ``spec.parameters``, plus ``task.uid``, which only exists once the Task does), and the
Task's namespace, which the route cannot carry. A report's ``extend`` is the results, a JSON object
of strings.

Both directions are bounded so that nothing is stuck on a link that cannot carry it: a request over
:data:`MAX_REQUEST_BYTES` is not sent (the Task fails with ``RequestTooLarge``), and results over
:data:`MAX_RESULTS_BYTES` are not reported as such (the edge reports a failure saying so).

What a hub does with a Task (the RunAction it builds, its writes to the Task's status) is in
:mod:`flows.diagnosis.hub_task`: an edge loads only this module and the processor types.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from flows.nodejobs.jobtype import ExtendError
from nodetask import nesting
from nodetask.flow import Flow, Step
from schemas.processors import Processor

__all__ = [
    "JOB_TYPE",
    "MAX_REQUEST_BYTES",
    "MAX_RESULTS_BYTES",
    "RESOURCE_TYPE",
    "RUN",
    "TaskJobType",
    "TaskRun",
    "decode_results",
    "encode_results",
    "results_bytes",
]

RESOURCE_TYPE: Final = "task"
RUN: Final = "Run"
FLOW: Final = Flow(name=RESOURCE_TYPE, first=RUN, steps={RUN: Step()})

MAX_RESULTS_BYTES: Final = 256 * 1024
"""Longest ``extend``: the results as JSON, in UTF-8 bytes (:func:`results_bytes`), the one measure of a
Task's results wherever they are bounded (the edge's processors, the edge's report, the hub). A report
frame escapes it at most to twice its length, so it stays under the hub's default frame limit of
1 MiB, and a Task's status stays far below etcd's 1.5 MiB with its request data."""
MAX_REQUEST_BYTES: Final = 768 * 1024
"""Longest :class:`TaskRun` a hub sends: a RunAction carries it as it is, and an edge takes frames of
at most 1 MiB. Each edge takes far less request data by default (its ``diagnosis.maxRequestBytes``,
:mod:`roles.edge.task_limits`) and fails a Task with more, naming that setting."""


class TaskRun(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The spec of a Task's RunAction: what its node runs. A wire type: fields added later get defaults."""

    namespace: str
    name: str
    operation: str
    processor: Processor
    request: dict[str, str] = {}
    """The Diagnosis's parameters, the Task's ``spec.parameters`` and ``task.uid``: what the processor receives."""


@dataclass(frozen=True, slots=True)
class TaskJobType:
    """The Task's job type on the edge (:class:`flows.nodejobs.jobtype.EdgeJobType`): one action, never exclusive."""

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


def results_bytes(results: Mapping[str, str]) -> int:
    """How large ``results`` are in the measure :data:`MAX_RESULTS_BYTES` bounds: bytes as JSON."""
    return len(msgspec.json.encode(dict(results)))


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
    size = len(extend.encode())
    if size > MAX_RESULTS_BYTES:
        raise ExtendError(f"the results are {size} bytes as JSON, more than the {MAX_RESULTS_BYTES} allowed")
    if not extend:
        return {}
    try:
        nesting.check_json(extend)  # JSON inside a string: the frame's own check never saw its brackets
        return _RESULTS.decode(extend)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ExtendError(f"the results are not a JSON object of strings: {exc}") from None
