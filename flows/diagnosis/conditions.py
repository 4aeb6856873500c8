"""Conditions of the diagnosis kinds, set as Kubernetes' condition helpers set them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import msgspec

from nodetask.clock import format_time
from schemas.diagnosis.v1 import Condition

__all__ = ["find_condition", "set_condition"]


def set_condition(conditions: Sequence[Condition], new: Condition, now: datetime) -> tuple[Condition, ...]:
    """``conditions`` with ``new`` in place of the one of its type, or added at the end.

    The transition time is ``now`` when the status changes (or the type is new) and kept otherwise,
    so a reason or message that changes without the status does not look like a transition.
    """
    out: list[Condition] = []
    found = False
    for condition in conditions:
        if condition.type != new.type:
            out.append(condition)
            continue
        found = True
        kept = condition.last_transition_time if condition.status == new.status else ""
        out.append(msgspec.structs.replace(new, last_transition_time=kept or format_time(now)))
    if not found:
        out.append(msgspec.structs.replace(new, last_transition_time=format_time(now)))
    return tuple(out)


def find_condition(conditions: Sequence[Condition], type_: str) -> Condition | None:
    """The condition of ``type_``, or None."""
    return next((c for c in conditions if c.type == type_), None)
