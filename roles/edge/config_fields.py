"""``updateFields`` of a ConfigUpdateJob applied to the agent's YAML configuration (pure).

Keys are dotted paths with optional list indices (``hubUrls[0]``, ``a.b.c``); values are typed as
keadm's ``--set`` types them: ``true``/``false`` are booleans, ``null`` is null, an integer without
a leading zero is an integer, anything else is a string. Keys are applied in sorted order, so the
result never depends on map order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["FieldError", "apply_fields", "parse_path", "typed_value"]

_SEGMENT: Final = re.compile(r"([A-Za-z_][A-Za-z0-9_-]*)((?:\[\d+\])*)")
_INDEX: Final = re.compile(r"\[(\d+)\]")
_INTEGER: Final = re.compile(r"-?(0|[1-9][0-9]*)")


class FieldError(ValueError):
    """An update field that cannot be applied; the message names the key."""


def typed_value(text: str) -> object:
    """``text`` typed as keadm's ``--set`` would."""
    if text in ("true", "false"):
        return text == "true"
    if text == "null":
        return None
    if _INTEGER.fullmatch(text):
        return int(text)
    return text


def parse_path(key: str) -> tuple[str | int, ...]:
    """The steps of ``key``: names for mapping keys, integers for list indices."""
    if not key:
        raise FieldError("an update field has an empty key")
    steps: list[str | int] = []
    for part in key.split("."):
        match = _SEGMENT.fullmatch(part)
        if match is None:
            raise FieldError(f"update field {key!r}: {part!r} is not a name with optional [index]")
        steps.append(match.group(1))
        steps.extend(int(i) for i in _INDEX.findall(match.group(2)))
    return tuple(steps)


def _set(node: Any, steps: tuple[str | int, ...], value: object, key: str) -> Any:
    step, rest = steps[0], steps[1:]
    if isinstance(step, int):
        items = list(node) if isinstance(node, list) else [] if node is None else None
        if items is None:
            raise FieldError(f"update field {key!r}: indexes into something that is not a list")
        if step > len(items):
            raise FieldError(f"update field {key!r}: index {step} is past the end of a list of {len(items)}")
        child = items[step] if step < len(items) else None
        new = _set(child, rest, value, key) if rest else value
        if step == len(items):
            items.append(new)
        else:
            items[step] = new
        return items
    mapping = dict(node) if isinstance(node, dict) else {} if node is None else None
    if mapping is None:
        raise FieldError(f"update field {key!r}: {step!r} is inside something that is not a mapping")
    mapping[step] = _set(mapping.get(step), rest, value, key) if rest else value
    return mapping


def apply_fields(document: Mapping[str, Any], fields: Mapping[str, str]) -> dict[str, Any]:
    """A copy of ``document`` with every field set. Errors: :class:`FieldError` naming the key."""
    result: Any = dict(document)
    for key in sorted(fields):
        result = _set(result, parse_path(key), typed_value(fields[key]), key)
    return dict(result)
