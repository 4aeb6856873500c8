"""Kubernetes field selectors: parsed, checked against a kind's selectable fields, and matched.

As in :mod:`nodetask.label_selectors`, the syntax and the messages are the pinned API server's
(1.20.2, ``k8s.io/apimachinery/pkg/fields`` and the core kinds' field-label conversions), so a
``--field-selector`` a device's local API refuses is one the cloud refuses too, in the same words.

Which fields a kind selects by, and the value of each for an object (a decoded JSON dict), are the
API server's ``ToSelectableFields`` of the core kinds a device caches: a field it allows but does
not fill (``status.podIPs``) reads as ``""`` there, and here.

Pure: strings and dicts in, requirements, field sets, booleans or :class:`SelectorError` out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from nodetask.label_selectors import SelectorError, go_quote

__all__ = [
    "FieldRequirement",
    "check_fields",
    "field_set",
    "fields_match",
    "parse_field_selector",
]

Object = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    """``field`` equals ``value`` (``=``, ``==``), or differs from it (``!=``, ``equals=False``)."""

    field: str
    value: str
    equals: bool = True

    def matches(self, fields: Mapping[str, str]) -> bool:
        """Whether an object with selectable ``fields`` satisfies this; a field it lacks reads as ``""``."""
        return (fields.get(self.field, "") == self.value) == self.equals

    def __str__(self) -> str:
        return f"{self.field}{'=' if self.equals else '!='}{_escape(self.value)}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


def fields_match(requirements: Iterable[FieldRequirement], fields: Mapping[str, str]) -> bool:
    """Whether ``fields`` satisfy every requirement (an empty selector selects everything)."""
    return all(r.matches(fields) for r in requirements)


def _split_terms(text: str) -> list[str]:
    # Commas split terms, except a backslash-escaped one, which stays (escape included) for unescaping.
    terms, start, escaped = [], 0, False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ",":
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return terms


def _unescape(value: str) -> str:
    out, escaped = [], False
    for ch in value:
        if escaped:
            if ch not in "\\,=":
                raise SelectorError(f"invalid field selector: invalid escape sequence: \\{ch}")
            out.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in ",=":
            # Go prints the rune with %v: its number.
            raise SelectorError(f"invalid field selector: unescaped character in value: {ord(ch)}")
        else:
            out.append(ch)
    if escaped:
        raise SelectorError("invalid field selector: invalid escape sequence: \\")
    return "".join(out)


def parse_field_selector(text: str) -> tuple[FieldRequirement, ...]:
    """The requirements of a ``fieldSelector`` string, in sorted term order; empty selects everything.

    The field names are not checked here (that depends on the kind: :func:`check_fields`).

    Errors: :class:`SelectorError` with the API server's message for a term without an operator,
    an unknown escape, or an unescaped ``,`` or ``=`` in a value.
    """
    requirements = []
    for term in sorted(_split_terms(text)) if text else ():
        if not term:
            continue
        # The first operator from the left; "!=" and "==" before "=", so that no "=" is left in a value.
        at = next(
            ((i, op) for i in range(len(term)) for op in ("!=", "==", "=") if term.startswith(op, i)),
            None,
        )
        if at is None:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{term}'")
        i, op = at
        requirements.append(FieldRequirement(field=term[:i], value=_unescape(term[i + len(op) :]), equals=op != "!="))
    return tuple(requirements)


# ------------------------------------------------------------------------ the kinds' selectable fields


def _get(obj: Object, *path: str) -> Any:
    node: Any = obj
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def _text(obj: Object, *path: str) -> str:
    value = _get(obj, *path)
    return value if isinstance(value, str) else ""


def _meta(obj: Object, *, namespaced: bool) -> dict[str, str]:
    fields = {"metadata.name": _text(obj, "metadata", "name")}
    if namespaced:
        fields["metadata.namespace"] = _text(obj, "metadata", "namespace")
    return fields


def _pod_fields(pod: Object) -> dict[str, str]:
    ips = _get(pod, "status", "podIPs")
    first_ip = ips[0].get("ip", "") if isinstance(ips, list) and ips and isinstance(ips[0], Mapping) else ""
    return {
        **_meta(pod, namespaced=True),
        "spec.nodeName": _text(pod, "spec", "nodeName"),
        "spec.restartPolicy": _text(pod, "spec", "restartPolicy"),
        "spec.schedulerName": _text(pod, "spec", "schedulerName"),
        "spec.serviceAccountName": _text(pod, "spec", "serviceAccountName"),
        "status.phase": _text(pod, "status", "phase"),
        "status.podIP": first_ip or _text(pod, "status", "podIP"),
        "status.nominatedNodeName": _text(pod, "status", "nominatedNodeName"),
    }


def _node_fields(node: Object) -> dict[str, str]:
    unschedulable = _get(node, "spec", "unschedulable") is True
    return {**_meta(node, namespaced=False), "spec.unschedulable": "true" if unschedulable else "false"}


def _secret_fields(secret: Object) -> dict[str, str]:
    return {**_meta(secret, namespaced=True), "type": _text(secret, "type")}


@dataclass(frozen=True, slots=True)
class _Selectable:
    allowed: frozenset[str]
    """The field labels the API server converts for the kind; any other is refused."""
    fields: Callable[[Object], dict[str, str]]
    registered: bool
    """Whether the kind has its own conversion (Kubernetes' message for others differs)."""


_KINDS: Final[Mapping[str, _Selectable]] = {
    "Pod": _Selectable(allowed=frozenset({*_pod_fields({}), "status.podIPs"}), fields=_pod_fields, registered=True),
    "Node": _Selectable(allowed=frozenset(_node_fields({})), fields=_node_fields, registered=True),
    "Secret": _Selectable(allowed=frozenset(_secret_fields({})), fields=_secret_fields, registered=True),
}
_DEFAULT: Final = _Selectable(
    allowed=frozenset({"metadata.name", "metadata.namespace"}),
    fields=lambda obj: _meta(obj, namespaced=True),
    registered=False,
)


def check_fields(kind: str, requirements: Iterable[FieldRequirement]) -> None:
    """Refuse a requirement on a field ``kind`` cannot be selected by, as the API server does.

    Errors: :class:`SelectorError` naming the first such field in the selector's order.
    """
    selectable = _KINDS.get(kind, _DEFAULT)
    for r in requirements:
        if r.field in selectable.allowed:
            continue
        if selectable.registered:
            raise SelectorError(f"field label not supported: {r.field}")
        raise SelectorError(
            f'{go_quote(r.field)} is not a known field selector: only "metadata.name", "metadata.namespace"'
        )


def field_set(kind: str, obj: Object) -> dict[str, str]:
    """The selectable fields of ``obj`` (of ``kind``) and their values."""
    return _KINDS.get(kind, _DEFAULT).fields(obj)
