"""Kubernetes object names, checked exactly as the API server checks them, and outside text made safe to show.

A node or job name read from outside (a URL path, a frame, a route) is checked here before it is
used for anything. Pasted unchecked into the path of an API request, ``x/../../healthz`` once made
a hub fetch another URL with its own credentials; a name that passes :func:`check_object_name`
cannot: it holds only ``a-z``, ``0-9``, ``-`` and ``.``, never ``..``, and is at most 253 characters.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from typing import Final

__all__ = [
    "MAX_LABEL",
    "MAX_SUBDOMAIN",
    "SUBDOMAIN_PATTERN",
    "InvalidName",
    "check_object_name",
    "clip",
    "event_name",
    "is_object_name",
    "object_name_problem",
]

MAX_SUBDOMAIN: Final = 253
"""Longest DNS-1123 subdomain: node names, object names, API groups."""
MAX_LABEL: Final = 63
"""Longest DNS-1123 label."""

_LABEL: Final = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
SUBDOMAIN_PATTERN: Final = rf"{_LABEL}(?:\.{_LABEL})*"
"""Kubernetes' ``dns1123SubdomainFmt`` (the length is checked apart, before any regex runs)."""
_SUBDOMAIN: Final = re.compile(SUBDOMAIN_PATTERN)

CLIP: Final = 256
"""Characters of outside text kept in an error message or a log line."""


class InvalidName(ValueError):
    """Not a Kubernetes object name; the message says what was expected."""


def is_object_name(name: str) -> bool:
    """Whether ``name`` is a Kubernetes object name (a DNS-1123 subdomain of at most 253 characters)."""
    return not object_name_problem(name)


def object_name_problem(name: str) -> str:
    """Why ``name`` is not a Kubernetes object name (a DNS-1123 subdomain), or ``""`` if it is one.

    Pure; the length is checked before the pattern, so its cost is bounded whatever the input.
    """
    if not name:
        return "must not be empty"
    if len(name) > MAX_SUBDOMAIN:
        return f"must be no more than {MAX_SUBDOMAIN} characters (it has {len(name)})"
    if not _SUBDOMAIN.fullmatch(name):
        return (
            "must be a lowercase RFC 1123 subdomain: lower case alphanumeric characters, '-' or '.',"
            " starting and ending with an alphanumeric character"
        )
    return ""


def check_object_name(name: str, *, what: str) -> str:
    """``name`` if it is a Kubernetes object name; else :class:`InvalidName` naming ``what`` and the value."""
    problem = object_name_problem(name)
    if problem:
        raise InvalidName(f"{what} {clip(name)!r} {problem}")
    return name


def clip(text: str, limit: int = CLIP) -> str:
    """``text``, or its first ``limit`` characters and how long it was: outside text as errors and logs show it."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def event_name(object_name: str, *key: str) -> str:
    """An Event's name about ``object_name``: random, or fixed by ``key`` (the same key, the same name).

    A fixed name makes recording idempotent: a second create of it is refused with 409 instead of
    showing the Event twice. The object's name is cut so that the Event's stays within 253 characters.
    """
    suffix = hashlib.sha256("\x00".join(key).encode()).hexdigest()[:12] if key else uuid.uuid4().hex[:12]
    return f"{object_name[:240].rstrip('.-')}.{suffix}"
