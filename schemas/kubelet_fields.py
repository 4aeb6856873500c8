"""Which KubeletConfiguration fields a ConfigUpdateJob with ``component: kubelet`` may set, and their values (pure).

One set of rules for the admission webhook and the edge agent (a job stored while the webhook was down reaches
the agent unchecked). The allowlist is what an operator tunes across a fleet; everything that decides who
may talk to the kubelet, where it listens, what it runs or where its files are is left to the device.
Values are ``updateFields`` strings, checked against the KubeletConfiguration ``v1beta1`` types (and the
ranges its validation enforces) before anything is written.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Final

__all__ = ["EVICTION_SIGNALS", "KUBELET_FIELDS", "Value", "kubelet_field_problem", "kubelet_value"]

EVICTION_SIGNALS: Final = frozenset(
    {
        "memory.available",
        "nodefs.available",
        "nodefs.inodesFree",
        "imagefs.available",
        "imagefs.inodesFree",
        "pid.available",
    }
)
_QUANTITY: Final = re.compile(r"(0|[1-9][0-9]{0,15})(Ki|Mi|Gi|Ti|k|M|G|T)?")
_PERCENT: Final = re.compile(r"(100|[1-9]?[0-9])(\.[0-9]{1,2})?%")
_LOG_SIZE: Final = re.compile(r"[1-9][0-9]{0,9}(Ki|Mi|Gi)?")

Value = int | bool | str | dict[str, str]
Parser = Callable[[str], Value]


def _integer(low: int, high: int) -> Parser:
    def parse(text: str) -> Value:
        if not re.fullmatch(r"-?(0|[1-9][0-9]{0,9})", text) or not low <= int(text) <= high:
            raise ValueError(f"must be an integer from {low} to {high}")
        return int(text)

    return parse


def _boolean(text: str) -> Value:
    if text not in ("true", "false"):
        raise ValueError("must be true or false")
    return text == "true"


def _log_size(text: str) -> Value:
    if not _LOG_SIZE.fullmatch(text):
        raise ValueError("must be a size such as 10Mi (a number, then Ki, Mi or Gi)")
    return text


def _eviction(text: str) -> Value:
    """``memory.available<100Mi,nodefs.available<10%`` (the kubelet's ``--eviction-hard`` form) as a map."""
    thresholds: dict[str, str] = {}
    for part in text.split(","):
        signal, sep, threshold = part.strip().partition("<")
        if not sep or signal not in EVICTION_SIGNALS:
            raise ValueError(
                f"{part.strip()[:60]!r} is not SIGNAL<THRESHOLD with a signal of {', '.join(sorted(EVICTION_SIGNALS))}"
            )
        if not (_QUANTITY.fullmatch(threshold) or _PERCENT.fullmatch(threshold)):
            raise ValueError(f"{signal}'s threshold {threshold[:30]!r} is not a quantity (100Mi) or a percentage (10%)")
        if signal in thresholds:
            raise ValueError(f"{signal} is given twice")
        thresholds[signal] = threshold
    return thresholds


KUBELET_FIELDS: Final[Mapping[str, Parser]] = {
    "maxPods": _integer(1, 10_000),
    "imageGCHighThresholdPercent": _integer(0, 100),
    "imageGCLowThresholdPercent": _integer(0, 100),
    "serializeImagePulls": _boolean,
    "containerLogMaxSize": _log_size,
    "containerLogMaxFiles": _integer(2, 1_000),
    "evictionHard": _eviction,
}
"""The fields, each set whole (``evictionHard`` replaces the kubelet's whole map, as the kubelet reads it)."""


def kubelet_field_problem(key: str) -> str:
    """Why a ConfigUpdateJob may not set the kubelet's ``key``, or "" when it may."""
    if key in KUBELET_FIELDS:
        return ""
    shown = key if len(key) <= 60 else f"{key[:60]}... ({len(key)} characters)"
    allowed = ", ".join(sorted(KUBELET_FIELDS))
    return (
        f"{shown} is not a kubelet setting a ConfigUpdateJob may change: only {allowed} may be"
        " (who may reach the kubelet, where it listens and what it runs stay the device's)"
    )


def kubelet_value(key: str, text: str) -> tuple[Value | None, str]:
    """``text`` as the KubeletConfiguration value of the allowed ``key``, or (None, why it is not one)."""
    try:
        return KUBELET_FIELDS[key](text), ""
    except ValueError as exc:
        return None, f"{key} {exc}"
