"""Events on node jobs and diagnosis objects (the controller's and the hubs'), which ``kubectl describe`` shows."""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import msgspec
import structlog

from nodetask.names import event_name
from roles.kube import ApiError, Conflict, Resource
from roles.kube.resources import EVENTS
from schemas import v1alpha2
from schemas.core import Event, EventSource, ObjectReference
from schemas.kinds import Kind
from schemas.meta import ObjectMeta

__all__ = ["EVENT_NAMESPACE", "EventSink", "job_event", "object_event", "record_event"]

T = TypeVar("T", bound=msgspec.Struct)

EVENT_NAMESPACE = "default"
"""Jobs are cluster-scoped; their Events live here, as KubeEdge's do."""


class EventSink(Protocol):
    """Where Events are created (:class:`~roles.kube.Kube`, or a fake in tests)."""

    async def create(self, resource: Resource[T], obj: T, *, namespace: str = "") -> T: ...


def job_event(
    kind: Kind,
    job: Any,
    *,
    reason: str,
    message: str,
    type_: str,
    component: str,
    now: str,
    instance: str = "",
    name: str = "",
) -> Event:
    """A new Event about ``job`` (a v1alpha2 node job of ``kind``) at ``now`` (RFC 3339), named ``name``
    (see :func:`event_name`; a random one when empty)."""
    return Event(
        metadata=ObjectMeta(name=name or event_name(job.metadata.name), namespace=EVENT_NAMESPACE),
        involved_object=ObjectReference(
            api_version=v1alpha2.API_VERSION, kind=kind.kind, name=job.metadata.name, uid=job.metadata.uid
        ),
        reason=reason,
        message=message,
        type=type_,
        first_timestamp=now,
        last_timestamp=now,
        source=EventSource(component=component),
        reporting_component=component,
        reporting_instance=instance,
    )


def object_event(
    *,
    api_version: str,
    kind: str,
    meta: ObjectMeta,
    reason: str,
    message: str,
    type_: str,
    component: str,
    now: str,
) -> Event:
    """A new Event about any object at ``now``: in the object's namespace, or :data:`EVENT_NAMESPACE`."""
    return Event(
        metadata=ObjectMeta(name=event_name(meta.name), namespace=meta.namespace or EVENT_NAMESPACE),
        involved_object=ObjectReference(
            api_version=api_version, kind=kind, name=meta.name, namespace=meta.namespace, uid=meta.uid
        ),
        reason=reason,
        message=message,
        type=type_,
        first_timestamp=now,
        last_timestamp=now,
        source=EventSource(component=component),
        reporting_component=component,
    )


async def record_event(kube: EventSink, event: Event, log: structlog.typing.FilteringBoundLogger) -> bool:
    """Create ``event`` in its namespace (:data:`EVENT_NAMESPACE` if it names none): whether it exists now.

    An Event that cannot be recorded is logged, never an error of the caller's. One that exists
    already (409: its fixed name was recorded before, e.g. by a controller that died before it could
    say so) counts as recorded.
    """
    try:
        await kube.create(EVENTS, event, namespace=event.metadata.namespace or EVENT_NAMESPACE)
    except Conflict:
        log.info("event_already_recorded", reason=event.reason, event_name=event.metadata.name)
    except ApiError as exc:
        log.warning("event_not_recorded", reason=event.reason, error=str(exc))
        return False
    return True
