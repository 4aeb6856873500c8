"""What the local API answers: Kubernetes ``Status`` failures, objects with their kind, and watch events.

Pure functions building the documents the API server would send; :mod:`.local_api` sends them.
"""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus
from typing import Any, Final

import msgspec

from roles.common.httpserver import Response
from roles.common.slots import Refusal
from roles.edge.cache.kinds import Resource
from roles.edge.cache.view import Change, ChangeType, Object
from roles.edge.local_api.paths import Target

__all__ = [
    "JSON",
    "details",
    "encode",
    "event_line",
    "expired",
    "failure",
    "named",
    "refusal_status",
    "watch_event",
    "with_kind",
]

JSON: Final = "application/json"
encode: Final = msgspec.json.Encoder().encode


def failure(code: int, reason: str, message: str, details: dict[str, str] | None = None) -> Response:
    """A Kubernetes ``Status`` failure, which clients show as ``Error from server (<reason>): <message>``."""
    status: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        status["details"] = details
    return Response.json(code, encode(status))


def named(target: Target) -> str:
    """How the API server names the target in its messages: ``pods "web-1"``, or ``pods``."""
    return f'{target.resource.plural} "{target.name}"' if target.name else target.resource.plural


def details(target: Target) -> dict[str, str]:
    return {"name": target.name, "kind": target.resource.plural} if target.name else {"kind": target.resource.plural}


def with_kind(obj: Object, resource: Resource) -> Object:
    # Lists' items may come without kind and apiVersion (the API server leaves them out); a single
    # object or a watch event's object must carry them for clients to decode it.
    if obj.get("kind") == resource.kind and obj.get("apiVersion") == resource.api_version:
        return obj
    return {**obj, "kind": resource.kind, "apiVersion": resource.api_version}


def watch_event(change: Change, selected: Callable[[Object], bool]) -> tuple[ChangeType, Object] | None:
    """The event a watch with selection ``selected`` sees for ``change``, or None.

    As in the API server's watch cache, an object updated into the selection is ADDED for the watch,
    one updated out of it is DELETED (with its new state), and one outside it before and after is
    not seen at all.
    """
    now = selected(change.object)
    if change.type is not ChangeType.MODIFIED or change.previous is None:
        return (change.type, change.object) if now else None
    before = selected(change.previous)
    if now and before:
        return (ChangeType.MODIFIED, change.object)
    if now:
        return (ChangeType.ADDED, change.object)
    if before:
        return (ChangeType.DELETED, change.object)
    return None


def event_line(kind: str, obj: Object) -> bytes:
    return encode({"type": kind, "object": obj}) + b"\n"


def expired(since: int, current: int) -> bytes:
    """The ERROR event that makes a client list again: the watch cannot start at ``since``."""
    message = (
        f"too old resource version: {since} ({current})"
        if since < current
        else f"too large resource version: {since}, current: {current}"
    )
    status = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Expired",
        "code": HTTPStatus.GONE,
    }
    return event_line("ERROR", status)


def refusal_status(refusal: Refusal, client: str, *, total: int, per_client: int) -> Response:
    """The 503 ``Status`` of a connection refused at accept, naming the cap it met and the setting that raises it.

    client-go retries a 503 that carries Retry-After, so kubectl waits for a place rather than failing at once.
    """
    if refusal == "per_peer":
        message = (
            f"the local API holds its limit of {per_client} connections from one client ({client}):"
            " close some, or raise localApi.maxConnectionsPerClient"
        )
    else:
        message = f"the local API holds its limit of {total} connections: raise localApi.maxConnections"
    status = failure(HTTPStatus.SERVICE_UNAVAILABLE, "ServiceUnavailable", message)
    return Response(status=status.status, body=status.body, content_type=JSON, headers=(("retry-after", "1"),))
