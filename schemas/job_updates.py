"""Admission of an UPDATE to a node job: what may change, and when a changed spec is validated again.

Metadata and status may change freely; the spec only while the job is Failure and only where a retry
may tune it (:mod:`schemas.retry`), and a new value of the retry annotation only once the job has
finished with nodes to retry. A changed spec is then validated whole, as on creation
(:func:`schemas.validation.validate_create`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Final

from nodetask.phases import JobPhase, NodeTaskPhase
from schemas import retry, v1alpha2
from schemas.checker import FieldError, capped, without_nulls
from schemas.core import RETRY_ANNOTATION
from schemas.validation import CLOSED_POLICY, AdmissionPolicy, validate_create

__all__ = ["IMMUTABLE_SPEC_MESSAGE", "validate_update"]

IMMUTABLE_SPEC_MESSAGE: Final = "spec fields are not allowed to update once it's created"
"""KubeEdge's exact text for a changed spec."""


def validate_update(new: object, old: object, *, policy: AdmissionPolicy = CLOSED_POLICY) -> tuple[FieldError, ...]:
    """An update may change metadata and status; the spec only as a retry allows (:mod:`schemas.retry`).

    A spec field that changes is refused with KubeEdge's text, naming it and why: only while the
    job is Failure may it change, and then only the fields a retry may tune; a changed spec is then
    validated whole, as on creation. A new value of the retry annotation is refused, with the
    reason, unless the job has finished with nodes to retry. An unchanged spec is not re-validated,
    so objects admitted under older rules (or stored before the webhook was registered) can still be
    updated, e.g. to remove their finalizer on deletion.
    """
    if not isinstance(new, dict) or not isinstance(old, dict):
        return validate_create(new, policy=policy)
    kind = new.get("kind") if isinstance(new.get("kind"), str) else ""
    phase, node_phases = _stored_phases(old)
    errors = list(_spec_change_errors(str(kind), new, old, phase))
    errors.extend(_retry_errors(new, old, phase, node_phases))
    if errors:
        # A spec of a million made-up fields changes a million fields.
        return capped(errors)
    if without_nulls(new.get("spec")) != without_nulls(old.get("spec")):
        return validate_create(new, policy=policy)
    return ()


def _stored_phases(obj: Mapping[str, Any]) -> tuple[JobPhase | None, tuple[NodeTaskPhase, ...]]:
    """The stored job's phase and node phases, as far as its status says (None: no phase to read)."""
    status = obj.get("status")
    if not isinstance(status, dict) or str(obj.get("apiVersion", "")).endswith("/v1alpha1"):
        # v1alpha1's status has no phase: the API server serves it without one.
        return None, ()
    try:
        phase = JobPhase(status.get("phase") or "")
    except ValueError:
        return None, ()
    entries = status.get("nodeStatus")
    node_phases: list[NodeTaskPhase] = []
    for entry in entries if isinstance(entries, list) else ():
        with contextlib.suppress(ValueError, AttributeError):
            node_phases.append(NodeTaskPhase(entry.get("phase") or ""))
    return phase, tuple(node_phases)


def _spec_change_errors(
    kind: str, new: Mapping[str, Any], old: Mapping[str, Any], phase: JobPhase | None
) -> list[FieldError]:
    changed = retry.changed_spec_fields(kind, without_nulls(new.get("spec")), without_nulls(old.get("spec")))
    if not changed:
        return []
    tunable = retry.tunable_fields(kind)
    allowed = {retry.spec_path(kind, field) for field in tunable}
    listed = ", ".join(tunable)
    errors = []
    for path in changed:
        if phase is not JobPhase.FAILURE:
            shown = "not initialised yet" if phase in (None, JobPhase.NONE) else phase.value
            why = f"the job is {shown}; only a Failure job may change {listed}, before a retry"
        elif path not in allowed:
            why = f"only {listed} may change before a retry; a different node task is a new job"
        else:
            continue
        errors.append(FieldError(path=path, message=f"{IMMUTABLE_SPEC_MESSAGE} ({why})"))
    return errors


def _retry_errors(
    new: Mapping[str, Any], old: Mapping[str, Any], phase: JobPhase | None, node_phases: tuple[NodeTaskPhase, ...]
) -> list[FieldError]:
    value = _annotation(new, RETRY_ANNOTATION)
    if value is None or value == _annotation(old, RETRY_ANNOTATION) or value == _handled(old):
        return []  # asks for nothing new
    path = f"metadata.annotations[{RETRY_ANNOTATION}]"
    if phase is None:
        why = f"set it through {v1alpha2.API_VERSION}: the {old.get('apiVersion')} status has no phase to check"
        return [FieldError(path=path, message=f"cannot retry: {why}")]
    refusal = retry.retry_refusal(phase, node_phases)
    return [FieldError(path=path, message=f"cannot retry: {refusal}")] if refusal else []


def _handled(obj: Mapping[str, Any]) -> str | None:
    """``status.retry.handled`` of a stored job (None: no retry value was ever handled)."""
    status = obj.get("status")
    record = status.get("retry") if isinstance(status, dict) else None
    if not isinstance(record, dict):
        return None
    handled = record.get("handled", "")  # omitted when empty, as every default
    return handled if isinstance(handled, str) else None


def _annotation(obj: Mapping[str, Any], key: str) -> str | None:
    metadata = obj.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    value = annotations.get(key) if isinstance(annotations, dict) else None
    return value if isinstance(value, str) else None
