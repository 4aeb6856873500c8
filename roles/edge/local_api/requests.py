"""What a request to the local API asks for, read as the API server reads it: its selection, its watch, its host.

Pure functions over the request's query; anything the API server would refuse raises :class:`BadRequest`
with the message a 400 ``Status`` carries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from nodetask.field_selectors import FieldRequirement, check_fields, field_set, fields_match, parse_field_selector
from nodetask.label_requirements import go_int
from nodetask.label_selectors import Requirement, labels_match, parse_label_selector
from nodetask.names import clip
from roles.edge.cache.view import Object
from roles.edge.local_api.paths import Target

__all__ = [
    "MAX_WATCH_S",
    "BadRequest",
    "Selection",
    "host_name",
    "int_parameter",
    "selection",
    "watch_start",
    "watch_timeout",
]

MAX_WATCH_S: Final = 1800.0
"""Longest a watch lasts without ``timeoutSeconds`` (the API server's default minRequestTimeout)."""
_SHOWN: Final = 64
"""Characters of a refused query parameter's value quoted back."""
_UINT64_DIGITS: Final = 20


class BadRequest(Exception):
    """The request's query cannot be served as asked; the message says why (a 400 ``Status``)."""


def host_name(host: str) -> str:
    """The name in a ``Host`` header, without its port."""
    host = host.lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.partition(":")[0]


@dataclass(frozen=True, slots=True)
class Selection:
    """Which objects a request selects: its namespace, label and field selectors."""

    kind: str
    namespace: str
    labels: tuple[Requirement, ...] = ()
    fields: tuple[FieldRequirement, ...] = ()

    def __call__(self, obj: Object) -> bool:
        meta = obj.get("metadata") or {}
        if self.namespace and meta.get("namespace") != self.namespace:
            return False
        if self.labels and not labels_match(self.labels, meta.get("labels") or {}):
            return False
        return not self.fields or fields_match(self.fields, field_set(self.kind, obj))


def selection(target: Target, query: dict[str, list[str]]) -> Selection:
    """The request's selection; the label selector is read first, then the field selector, as the API
    server does (so its first error is the one reported). ``limit`` is checked as the API server checks
    it, and then not applied: a device's lists are small, so they come whole (with no ``continue``),
    as the API server's watch cache answers a list at ``resourceVersion=0``."""
    int_parameter(query, "limit", "a number of objects")
    labels = parse_label_selector(query.get("labelSelector", [""])[0])
    fields = parse_field_selector(query.get("fieldSelector", [""])[0])
    check_fields(target.resource.kind, fields)
    if target.name:  # a watch of one object: the API server makes it a field selector
        fields = (*fields, FieldRequirement("metadata.name", target.name))
    return Selection(kind=target.resource.kind, namespace=target.namespace, labels=labels, fields=fields)


def int_parameter(query: dict[str, list[str]], name: str, what: str) -> int | None:
    """Query parameter ``name`` read as the API server reads an int64 one (``strconv.ParseInt``); None if absent.

    Errors: :class:`BadRequest` naming the parameter (its value clipped) for anything else, however
    long: it is never handed to ``int()`` whole, which refuses more than 4,300 digits with a ValueError.
    """
    text = query.get(name, [""])[0]
    if not text:
        return None
    value = go_int(text)
    if value is None:
        raise BadRequest(f"{name} {clip(text, _SHOWN)!r} is not {what} (a whole number from -2^63 to 2^63-1)")
    return value


def watch_start(query: dict[str, list[str]]) -> int | None:
    """The resource version a watch starts after; None for ``""`` and ``"0"``: the current objects first."""
    text = query.get("resourceVersion", [""])[0]
    # The API server's resource versions are uint64s; checked by length before int() reads a digit.
    digits = text.lstrip("0") or "0"
    if text and not (text.isascii() and text.isdecimal() and len(digits) <= _UINT64_DIGITS and int(digits) < 2**64):
        raise BadRequest(
            f"resourceVersion {clip(text, _SHOWN)!r} is not one of this API's resource versions"
            " (decimal numbers below 2^64)"
        )
    since = int(digits)
    return since or None


def watch_timeout(query: dict[str, list[str]]) -> float:
    seconds = int_parameter(query, "timeoutSeconds", "a number of seconds")
    return float(seconds) if seconds is not None and seconds > 0 else MAX_WATCH_S
