"""API server errors as exceptions that say what failed."""

from __future__ import annotations

import msgspec

from schemas.core import Status

_STATUS = msgspec.json.Decoder(Status)


class ApiError(Exception):
    """A request the API server refused or could not answer."""

    def __init__(self, status: int, reason: str, message: str, *, what: str = "") -> None:
        super().__init__(f"{what}: {status} {reason}: {message}" if what else f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class KubeconfigError(Exception):
    """The API server's address and credentials could not be loaded: a kubeconfig that is missing,
    unreadable or malformed, or no ServiceAccount outside a pod. The message names the cause."""


class NotFound(ApiError):
    """404 naming the object: it does not exist."""


class Unserved(ApiError):
    """404 for the resource itself: its path is not served (yet).

    An API server that is starting, or a CRD whose endpoints are not yet (or no longer) installed,
    answers ``404 page not found`` in plain text rather than a Status naming an object. That says
    nothing about the object, so it is retried like any other transient error, never taken for
    "the object is gone".
    """


class Conflict(ApiError):
    """409: a stale resourceVersion, or an object that already exists."""


class Gone(ApiError):
    """410: the resourceVersion to watch from is too old; relist."""


class Unreachable(ApiError):
    """No HTTP answer at all (connection refused, TLS failure, timeout)."""


def from_response(status: int, body: bytes, *, what: str) -> ApiError:
    """The exception for a non-2xx answer, using the Status body when there is one.

    A 404 is :class:`NotFound` only when its Status says ``NotFound`` (the object is missing);
    without one it is :class:`Unserved` (the resource's path is not served).
    """
    try:
        parsed = _STATUS.decode(body)
        reason, message, is_status = parsed.reason or "Error", parsed.message, True
    except (msgspec.DecodeError, msgspec.ValidationError):
        reason, message, is_status = "Error", body[:200].decode(errors="replace").strip(), False
    if status == 404 and not (is_status and reason == "NotFound"):
        return Unserved(status, "NotServed", message or "page not found", what=what)
    cls = {404: NotFound, 409: Conflict, 410: Gone}.get(status, ApiError)
    return cls(status, reason, message, what=what)


def too_large(error: ApiError) -> bool:
    """Whether the API server or etcd refused a write because the object is too large.

    The API server answers 413 for a request body over its limit (3 MiB); etcd's own limit (1.5 MiB
    by default) comes back as a 500 with etcd's text.
    """
    return error.status == 413 or (error.status == 500 and "request is too large" in error.message)
