"""Label selector requirements as the API server holds them, and whether labels satisfy them.

The part of :mod:`nodetask.label_selectors` that an object's own selector needs (matching, and the
query-string form); parsing and validating a selector's text stay there, so that what only reads a
selector (a device's job specs, for one) does not load the parser.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Final

import msgspec

__all__ = ["Operator", "Requirement", "format_label_selector", "go_int", "labels_match", "requirement_matches"]


class Operator(enum.StrEnum):
    """``selection.Operator``: the values are Go's, as its errors and String() show them."""

    IN = "in"
    NOT_IN = "notin"
    EQUALS = "="
    DOUBLE_EQUALS = "=="
    NOT_EQUALS = "!="
    EXISTS = "exists"
    DOES_NOT_EXIST = "!"
    GREATER_THAN = "gt"
    LESS_THAN = "lt"


_INT64: Final = re.compile(r"[+-]?[0-9]+")
_INT64_DIGITS: Final = 19
"""Digits of the largest int64 (9223372036854775807)."""


def go_int(text: str) -> int | None:
    """``strconv.ParseInt(text, 10, 64)``: ASCII digits with an optional sign, within int64; else None."""
    if not _INT64.fullmatch(text):
        return None
    # Counted before int() reads them: Python refuses (ValueError) strings of more than 4,300 digits,
    # which a selector in a URL can hold; leading zeros count there too, though Go skips them.
    digits = text.lstrip("+-").lstrip("0") or "0"
    if len(digits) > _INT64_DIGITS:
        return None
    value = int(digits)
    value = -value if text.startswith("-") else value
    return value if -(2**63) <= value < 2**63 else None


def requirement_matches(key: str, op: Operator, values: Collection[str], labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` satisfy the requirement ``key op values`` (``labels.Requirement.Matches``).

    A function of its parts, so that callers holding them in another shape (``metav1.LabelSelector``)
    match without building a :class:`Requirement` per call.
    """
    value = labels.get(key)
    match op:
        case Operator.IN | Operator.EQUALS | Operator.DOUBLE_EQUALS:
            return value is not None and value in values
        case Operator.NOT_IN | Operator.NOT_EQUALS:
            return value is None or value not in values
        case Operator.EXISTS:
            return value is not None
        case Operator.DOES_NOT_EXIST:
            return value is None
        case _:  # GREATER_THAN, LESS_THAN: both sides must read as integers, else no match
            have = None if value is None else go_int(value)
            want = go_int(next(iter(values))) if len(values) == 1 else None
            if have is None or want is None:
                return False
            return have > want if op is Operator.GREATER_THAN else have < want


class Requirement(msgspec.Struct, frozen=True):
    """One requirement of a label selector: ``key``, ``op`` and the values (a sorted set, as Go keeps them).

    Built unchecked, like Go's struct literal; :func:`new_requirement` checks it as the API server does.
    """

    key: str
    op: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy this requirement."""
        return requirement_matches(self.key, self.op, self.values, labels)

    def __str__(self) -> str:
        """Kubernetes' form (``Requirement.String``), which :func:`parse_label_selector` reads back."""
        match self.op:
            case Operator.EXISTS:
                return self.key
            case Operator.DOES_NOT_EXIST:
                return f"!{self.key}"
            case Operator.IN | Operator.NOT_IN:
                return f"{self.key} {self.op} ({','.join(sorted(self.values))})"
            case Operator.GREATER_THAN:
                return f"{self.key}>{','.join(self.values)}"
            case Operator.LESS_THAN:
                return f"{self.key}<{','.join(self.values)}"
            case _:
                return f"{self.key}{self.op}{','.join(sorted(self.values))}"


def labels_match(requirements: Iterable[Requirement], labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` satisfy every requirement (an empty selector selects everything)."""
    return all(r.matches(labels) for r in requirements)


def format_label_selector(requirements: Iterable[Requirement]) -> str:
    """The ``labelSelector`` query-string form of ``requirements``, in their order."""
    return ",".join(str(r) for r in requirements)
