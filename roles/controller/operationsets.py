"""The OperationSet pass: paths and readiness into the status, the graph's hash onto a label.

KubeDiag's graph builder retries a bad graph silently forever; here one pass writes the verdict
(:func:`flows.diagnosis_pipeline.operation_set_status`): ready with the paths, or not ready with a
condition naming each bad node and a Warning Event, and nothing more until the spec changes.
"""

from __future__ import annotations

from datetime import datetime

import msgspec
import structlog

from flows.diagnosis_conditions import find_condition
from flows.diagnosis_pipeline import HASH_LABEL, READY_CONDITION, operation_set_status
from nodetask.clock import format_time
from roles.events import object_event, record_event
from roles.kube import ApiError, Conflict, Kube
from roles.kube.resources import OPERATION_SETS
from schemas.diagnosis import API_VERSION, OperationSet

__all__ = ["reconcile_operation_set", "report_undecodable"]

Log = structlog.typing.FilteringBoundLogger
COMPONENT = "nodetaskd-controller"


async def reconcile_operation_set(kube: Kube, operation_set: OperationSet, *, now: datetime, log: Log) -> None:
    """Write ``operation_set``'s status and hash label where they differ from what its spec says."""
    name = operation_set.metadata.name
    digest, status = operation_set_status(operation_set, now=now)
    if status != operation_set.status:

        def mutate(fresh: OperationSet) -> OperationSet | None:
            new = operation_set_status(fresh, now=now)[1]
            return None if new == fresh.status else msgspec.structs.replace(fresh, status=new)

        written = await kube.update_status(OPERATION_SETS, name, mutate, current=operation_set)
        if written is not None and written.status != operation_set.status:
            operation_set = written
            log.info("operation_set_status", ready=written.status.ready, paths=len(written.status.paths))
            if not written.status.ready:
                ready = find_condition(written.status.conditions, READY_CONDITION)
                await _event(kube, operation_set, "InvalidGraph", ready.message if ready else "", now=now, log=log)
    if operation_set.metadata.labels.get(HASH_LABEL) != digest:
        version = operation_set.metadata.resource_version
        patch = {"metadata": {"labels": {HASH_LABEL: digest}, "resourceVersion": version}}
        try:
            await kube.merge_patch(OPERATION_SETS, name, patch)
        except Conflict:
            return  # changed meanwhile: the change's own pass labels it


async def report_undecodable(kube: Kube, name: str, error: str, *, now: datetime, log: Log) -> None:
    """An OperationSet whose spec does not even decode is not ready, with the decoder's words."""
    condition = {
        "type": "Ready",
        "status": "False",
        "reason": "InvalidSpec",
        "message": error,
        "lastTransitionTime": format_time(now),
    }
    patch = {"status": {"ready": False, "paths": [], "conditions": [condition]}}
    try:
        await kube.merge_patch_raw(OPERATION_SETS, name, patch, subresource="status")
    except ApiError as exc:
        log.warning("invalid_operation_set_not_reported", operation_set=name, error=str(exc))
        return
    log.warning("invalid_operation_set", operation_set=name, error=error)


async def _event(
    kube: Kube, operation_set: OperationSet, reason: str, message: str, *, now: datetime, log: Log
) -> None:
    event = object_event(
        api_version=API_VERSION,
        kind="OperationSet",
        meta=operation_set.metadata,
        reason=reason,
        message=message,
        type_="Warning",
        component=COMPONENT,
        now=format_time(now),
    )
    await record_event(kube, event, log)
