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


class NotFound(ApiError):
    """404: the object does not exist."""


class Conflict(ApiError):
    """409: a stale resourceVersion, or an object that already exists."""


class Gone(ApiError):
    """410: the resourceVersion to watch from is too old; relist."""


class Unreachable(ApiError):
    """No HTTP answer at all (connection refused, TLS failure, timeout)."""


def from_response(status: int, body: bytes, *, what: str) -> ApiError:
    """The exception for a non-2xx answer, using the Status body when there is one."""
    try:
        parsed = _STATUS.decode(body)
        reason, message = parsed.reason or "Error", parsed.message
    except (msgspec.DecodeError, msgspec.ValidationError):
        reason, message = "Error", body[:200].decode(errors="replace")
    cls = {404: NotFound, 409: Conflict, 410: Gone}.get(status, ApiError)
    return cls(status, reason, message, what=what)


def too_large(error: ApiError) -> bool:
    """Whether the API server or etcd refused a write because the object is too large.

    The API server answers 413 for a request body over its limit (3 MiB); etcd's own limit (1.5 MiB
    by default) comes back as a 500 with etcd's text.
    """
    return error.status == 413 or (error.status == 500 and "request is too large" in error.message)
