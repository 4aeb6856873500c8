"""The OperationSet pass: paths and readiness into the status, the graph's hash onto a label.

KubeDiag's graph builder retries a bad graph silently forever; here one pass writes the verdict
(:func:`flows.diagnosis.pipeline.operation_set_status`): ready with the paths, or not ready with a
condition naming each bad node and a Warning Event, and nothing more until the spec changes.
"""

from __future__ import annotations

from datetime import datetime

import msgspec
import structlog

from flows.diagnosis.conditions import find_condition
from flows.diagnosis.pipeline import (
    HASH_LABEL,
    READY_CONDITION,
    operation_set_status,
    refused_as_too_large,
    too_large_status,
)
from nodetask.clock import format_time
from roles.common.events import object_event, record_event
from roles.kube import ApiError, Conflict, Kube
from roles.kube.errors import too_large
from roles.kube.resources import OPERATION_SETS
from schemas.diagnosis.v1 import API_VERSION, OperationSet

__all__ = ["reconcile_operation_set", "report_undecodable"]

Log = structlog.typing.FilteringBoundLogger
COMPONENT = "nodetaskd-controller"


async def reconcile_operation_set(kube: Kube, operation_set: OperationSet, *, now: datetime, log: Log) -> None:
    """Write ``operation_set``'s status and hash label where they differ from what its spec says.

    A status the API server refuses for its size is replaced by a small one saying so (not ready),
    and not tried again until the graph changes: the same write would be refused at every retry.
    """
    name = operation_set.metadata.name
    digest, status = operation_set_status(operation_set, now=now)
    if status != operation_set.status and not refused_as_too_large(operation_set, digest):

        def mutate(fresh: OperationSet) -> OperationSet | None:
            new = operation_set_status(fresh, now=now)[1]
            return None if new == fresh.status else msgspec.structs.replace(fresh, status=new)

        try:
            written = await kube.update_status(OPERATION_SETS, name, mutate, current=operation_set)
        except ApiError as exc:
            if not too_large(exc):
                raise
            written = await _refused(kube, operation_set, exc, now=now, log=log)
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


async def _refused(
    kube: Kube, operation_set: OperationSet, error: ApiError, *, now: datetime, log: Log
) -> OperationSet | None:
    """Write the small status of an OperationSet whose paths were refused for their size; None if even that
    is refused (logged: nothing more can be written)."""
    name = operation_set.metadata.name
    message = f"the API server refused to store its status: {error.message}"
    log.error("operation_set_status_too_large", operation_set=name, error=str(error))

    def mutate(fresh: OperationSet) -> OperationSet | None:
        new = too_large_status(fresh, message, now=now)
        return None if new == fresh.status else msgspec.structs.replace(fresh, status=new)

    try:
        return await kube.update_status(OPERATION_SETS, name, mutate, current=operation_set)
    except ApiError as exc:
        if not too_large(exc):
            raise
        log.error("operation_set_failure_too_large", operation_set=name, error=str(exc))
        return None


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
