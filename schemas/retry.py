"""Retrying a finished node job: the rules the admission webhook and the controller share. Pure.

Seed 000's drawback foresees it ("a in-progress node job cannot be modified until the node job phase
is failures, then the node job spec can be modified and job task can be retried"); KubeEdge never
built it. Here a job whose phase is final (Failure, or Completed with tolerated failures) is retried
when its annotation :data:`~schemas.core.RETRY_ANNOTATION` takes a value the controller has not
handled yet (``status.retry.handled``): its Failure and Unknown nodes run again, the others stay.

While a job is Failure (the seed's rule), and only then, its spec may change before the retry, and
only where a retry makes sense of it (:data:`RETRY_TUNABLE`): how long, how many at once, how many
may fail, what to check, how often to pull, with which credentials. What a node task *is* (the
version, image, images, updateFields, the node selection) never changes: a different task is a new
job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from nodetask.phases import JobPhase, NodeTaskPhase
from schemas.core import RETRY_ANNOTATION
from schemas.v1alpha2 import RetryStatus

__all__ = [
    "FINAL_PHASES",
    "RETRIABLE_NODE_PHASES",
    "RETRY_TUNABLE",
    "changed_spec_fields",
    "requested_retry",
    "retry_refusal",
    "spec_path",
    "tunable_fields",
]

FINAL_PHASES: Final = frozenset({JobPhase.COMPLETED, JobPhase.FAILURE})
"""Job phases a retry may start from."""
RETRIABLE_NODE_PHASES: Final = frozenset({NodeTaskPhase.FAILURE, NodeTaskPhase.UNKNOWN})
"""Node phases a retry sends back to Pending; Successful nodes are never run again."""

RETRY_TUNABLE: Final = ("timeoutSeconds", "concurrency", "failureTolerate", "checkItems", "retryTimes", "imageSecrets")
"""Spec fields a Failure job may change before its retry (each kind has those of them it has)."""

_TEMPLATE: Final = "imagePrePullTemplate"
"""Where an ImagePrePullJob keeps the fields the other kinds keep in ``spec``."""
_KIND_FIELDS: Final[Mapping[str, frozenset[str]]] = {
    "NodeUpgradeJob": frozenset({"timeoutSeconds", "concurrency", "failureTolerate", "checkItems"}),
    "ImagePrePullJob": frozenset(RETRY_TUNABLE),
    "ConfigUpdateJob": frozenset({"timeoutSeconds", "concurrency", "failureTolerate"}),
}


def requested_retry(annotations: Mapping[str, str], retry: RetryStatus | None) -> str | None:
    """The retry annotation's value when it asks for a retry not handled yet, else None.

    Absent asks for nothing; any other value, the empty string included, asks once: the controller
    records it in ``status.retry.handled`` with the retry it starts (or the refusal it gives).
    """
    value = annotations.get(RETRY_ANNOTATION)
    if value is None or (retry is not None and retry.handled == value):
        return None
    return value


def retry_refusal(phase: JobPhase, node_phases: Iterable[NodeTaskPhase]) -> str:
    """Why a job in ``phase`` with these node phases cannot be retried now; empty when it can."""
    if phase not in FINAL_PHASES:
        shown = phase.value or "not initialised yet"
        return f"the job is {shown}: only a finished job (Failure, or Completed with failed nodes) can be retried"
    if not any(p in RETRIABLE_NODE_PHASES for p in node_phases):
        return "no node of the job failed or timed out: there is nothing to retry"
    return ""


def tunable_fields(kind: str) -> tuple[str, ...]:
    """The spec fields of ``kind`` a Failure job may change before a retry, in :data:`RETRY_TUNABLE`'s order."""
    allowed = _KIND_FIELDS.get(kind, frozenset())
    return tuple(f for f in RETRY_TUNABLE if f in allowed)


def spec_path(kind: str, field: str) -> str:
    """The JSON path of a targeting or execution field of ``kind`` (``spec.imagePrePullTemplate.concurrency``)."""
    return f"spec.{_TEMPLATE}.{field}" if kind == "ImagePrePullJob" else f"spec.{field}"


def changed_spec_fields(kind: str, new_spec: Any, old_spec: Any) -> tuple[str, ...]:
    """The JSON paths of the spec fields that differ between two specs of ``kind``, in sorted order.

    Specs arrive as decoded JSON, with nulls already dropped (null and absent are one field). An
    ImagePrePullJob's fields are compared inside its template; anything that is not an object where
    an object belongs counts as a change of the whole.
    """
    if not isinstance(new_spec, dict) or not isinstance(old_spec, dict):
        return () if new_spec == old_spec else ("spec",)
    changed = _changed(new_spec, old_spec, "spec")
    if kind == "ImagePrePullJob" and f"spec.{_TEMPLATE}" in changed:
        new_t, old_t = new_spec.get(_TEMPLATE), old_spec.get(_TEMPLATE)
        if isinstance(new_t, dict) and isinstance(old_t, dict):
            changed = [p for p in changed if p != f"spec.{_TEMPLATE}"] + _changed(new_t, old_t, f"spec.{_TEMPLATE}")
    return tuple(sorted(changed))


def _changed(new: Mapping[str, Any], old: Mapping[str, Any], path: str) -> list[str]:
    return [f"{path}.{key}" for key in sorted(new.keys() | old.keys()) if new.get(key) != old.get(key)]
