"""``updateFields`` of a ConfigUpdateJob applied to the agent's YAML configuration (pure).

Keys are dotted paths with optional list indices (``hubUrls[0]``, ``a.b.c``), at most
:data:`~schemas.update_fields.MAX_KEY_DEPTH` parts deep; values are typed as keadm's ``--set`` types
them (:func:`~schemas.update_fields.typed_value`). Keys are applied in sorted order, so the result
never depends on map order. Which keys a job may set at all is decided before, by
:func:`schemas.update_fields.key_problem`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from schemas.update_fields import MAX_KEY_DEPTH, shown_key, typed_value

__all__ = ["FieldError", "apply_fields", "parse_path", "typed_value"]

_SEGMENT: Final = re.compile(r"([A-Za-z_][A-Za-z0-9_-]*)((?:\[\d+\])*)")
_INDEX: Final = re.compile(r"\[(\d+)\]")


class FieldError(ValueError):
    """An update field that cannot be applied; the message names the key."""


def parse_path(key: str) -> tuple[str | int, ...]:
    """The steps of ``key``: names for mapping keys, integers for list indices."""
    if not key:
        raise FieldError("an update field has an empty key")
    steps: list[str | int] = []
    for part in key.split("."):
        match = _SEGMENT.fullmatch(part)
        if match is None:
            raise FieldError(f"update field {shown_key(key)}: {shown_key(part)} is not a name with optional [index]")
        steps.append(match.group(1))
        steps.extend(int(i) for i in _INDEX.findall(match.group(2)))
        if len(steps) > MAX_KEY_DEPTH:
            # Applying a path recurses once per step.
            raise FieldError(f"update field {shown_key(key)} is deeper than {MAX_KEY_DEPTH} parts")
    return tuple(steps)


def _set(node: Any, steps: tuple[str | int, ...], value: object, key: str) -> Any:
    step, rest = steps[0], steps[1:]
    if isinstance(step, int):
        items = list(node) if isinstance(node, list) else [] if node is None else None
        if items is None:
            raise FieldError(f"update field {shown_key(key)}: indexes into something that is not a list")
        if step > len(items):
            raise FieldError(f"update field {shown_key(key)}: index {step} is past the end of a list of {len(items)}")
        child = items[step] if step < len(items) else None
        new = _set(child, rest, value, key) if rest else value
        if step == len(items):
            items.append(new)
        else:
            items[step] = new
        return items
    mapping = dict(node) if isinstance(node, dict) else {} if node is None else None
    if mapping is None:
        raise FieldError(f"update field {shown_key(key)}: {step!r} is inside something that is not a mapping")
    mapping[step] = _set(mapping.get(step), rest, value, key) if rest else value
    return mapping


def apply_fields(document: Mapping[str, Any], fields: Mapping[str, str]) -> dict[str, Any]:
    """A copy of ``document`` with every field set. Errors: :class:`FieldError` naming the key."""
    result: Any = dict(document)
    for key in sorted(fields):
        result = _set(result, parse_path(key), typed_value(fields[key]), key)
    return dict(result)
