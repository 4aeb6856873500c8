"""Edge autonomy, the pure parts: who asked for it, and the ``Autonomy`` condition a device reports.

A Node asks for autonomy with OpenYurt's annotations: ``node.beta.openyurt.io/autonomy: "true"``
(the seed's, forever) or ``node.openyurt.io/autonomy-duration: <Go duration>`` (OpenYurt 1.6; zero
or less means forever, a positive one is how long its Pods tolerate the node being unreachable,
and an unparsable one means not asked, with the reason kept for the log).

The condition follows OpenYurt's check (``autonomy.go``), which runs every 10 s on the device,
offline too: ``False``/``autonomy disabled`` while not requested; ``True``/``autonomy enabled
successfully`` while requested and no cached key is errored; ``Unknown``/``cache failed`` once keys
have stayed errored for more than :data:`FAILED_CHECKS_BEFORE_UNKNOWN` consecutive checks, with the
errors (sorted, capped) as its message; back to ``True`` on the first check with none. Checks in
between leave the condition as it was. Beyond OpenYurt, both annotations enable the condition
(OpenYurt's check reads only the deprecated one) and the message is bounded.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Final

import msgspec

from nodetask.phases import ConditionStatus

__all__ = [
    "AUTONOMY_ANNOTATION",
    "BINDABLE_LABEL",
    "CONDITION_TYPE",
    "DURATION_ANNOTATION",
    "FAILED_CHECKS_BEFORE_UNKNOWN",
    "STATUS_LABEL",
    "AutonomyCheck",
    "AutonomyRequest",
    "Verdict",
    "autonomy_request",
    "check",
    "parse_go_duration",
]

AUTONOMY_ANNOTATION: Final = "node.beta.openyurt.io/autonomy"
DURATION_ANNOTATION: Final = "node.openyurt.io/autonomy-duration"
STATUS_LABEL: Final = "node.autonomy.openyurt.io/status"
"""The controller's approval, ``true`` or ``false`` from the condition (the seed's, never built upstream)."""
BINDABLE_LABEL: Final = "nodetask.kubeedge.io/autonomy-bindable"
"""On a Namespace, ``"true"``: its Pods' tolerations may be bound to their node's autonomy duration. Whoever
may patch a Node then decides how long those Pods survive the node being unreachable, so a namespace
has to say it accepts that (only this exact value does); Pods elsewhere are never bound."""
CONDITION_TYPE: Final = "Autonomy"
FAILED_CHECKS_BEFORE_UNKNOWN: Final = 3
MAX_ERRORS_SHOWN: Final = 10
"""Errored keys named in the condition's message; the rest are counted."""
MAX_ERROR_TEXT: Final = 200

DISABLED: Final = "autonomy disabled"
ENABLED: Final = "autonomy enabled successfully"
CACHE_FAILED: Final = "cache failed"

# Go's time.ParseDuration units, in seconds.
_UNITS: Final = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,  # U+00B5 micro sign
    "μs": 1e-6,  # U+03BC Greek mu
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_PART: Final = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(text: str) -> float:
    """Seconds in a Go duration (``"1h30m"``, ``"300ms"``, ``"-1.5h"``, ``"0"``), as ``time.ParseDuration``.

    Errors: ValueError naming the text, for anything Go would refuse (no unit, an unknown unit, an
    empty number, whitespace).
    """
    rest = text
    sign = 1.0
    if rest[:1] in ("-", "+"):
        sign = -1.0 if rest[0] == "-" else 1.0
        rest = rest[1:]
    if rest == "0":
        return 0.0
    if not rest:
        raise ValueError(f"invalid duration {text!r}")
    total = 0.0
    while rest:
        part = _PART.match(rest)
        if part is None or part.group(1) in ("", "."):
            raise ValueError(f"invalid duration {text!r}")
        total += float(part.group(1)) * _UNITS[part.group(2)]
        rest = rest[part.end() :]
    if not math.isfinite(total):
        raise ValueError(f"invalid duration {text!r}: out of range")
    return sign * total


class AutonomyRequest(msgspec.Struct, frozen=True):
    """What a Node's annotations ask for."""

    requested: bool
    duration: float | None = None
    """Seconds its Pods tolerate the node being unreachable or not ready; None: forever."""
    problem: str = ""
    """Why an annotation present was not understood (it then asks for nothing)."""


def autonomy_request(annotations: Mapping[str, str]) -> AutonomyRequest:
    """Whether a Node with ``annotations`` asks for autonomy, and for how long. Pure."""
    if annotations.get(AUTONOMY_ANNOTATION) == "true":
        return AutonomyRequest(requested=True)
    text = annotations.get(DURATION_ANNOTATION)
    if text is None:
        return AutonomyRequest(requested=False)
    try:
        seconds = parse_go_duration(text)
    except ValueError as exc:
        return AutonomyRequest(requested=False, problem=f"{DURATION_ANNOTATION}: {exc}")
    return AutonomyRequest(requested=True, duration=seconds if seconds > 0 else None)


class Verdict(msgspec.Struct, frozen=True):
    """The ``Autonomy`` condition's status, reason and message."""

    status: ConditionStatus
    reason: str
    message: str


class AutonomyCheck(msgspec.Struct, frozen=True):
    """What one check leaves for the next: consecutive checks with errored keys, and the condition."""

    failing: int = 0
    verdict: Verdict | None = None
    """None until a check has set the condition."""


def check(state: AutonomyCheck, *, requested: bool, errors: Mapping[str, str]) -> AutonomyCheck:
    """One periodic check: ``errors`` maps each errored key to its reason. Pure.

    The condition changes only as the module docstring says; compare ``verdict`` before and after
    to know whether there is anything to send.
    """
    if not requested:
        verdict = Verdict(ConditionStatus.FALSE, DISABLED, "autonomy is not requested for this node")
        return AutonomyCheck(failing=0, verdict=verdict)
    if not errors:
        verdict = Verdict(ConditionStatus.TRUE, ENABLED, "autonomy is enabled and the cache works")
        return AutonomyCheck(failing=0, verdict=verdict)
    failing = state.failing + 1
    if failing <= FAILED_CHECKS_BEFORE_UNKNOWN:
        return AutonomyCheck(failing=failing, verdict=state.verdict)
    return AutonomyCheck(failing=failing, verdict=Verdict(ConditionStatus.UNKNOWN, CACHE_FAILED, _message(errors)))


def _message(errors: Mapping[str, str]) -> str:
    keys = sorted(errors)
    lines = [f"{key}: {errors[key][:MAX_ERROR_TEXT]}" for key in keys[:MAX_ERRORS_SHOWN]]
    if len(keys) > MAX_ERRORS_SHOWN:
        lines.append(f"... and {len(keys) - MAX_ERRORS_SHOWN} more errored keys")
    return "\n".join(lines)
