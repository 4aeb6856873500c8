"""KubeEdge's upgrade version rule, on its own so that the edge agent's Check need not load the webhook's rules.

The admission webhook (:mod:`schemas.validation`) and the agent's NodeUpgradeJob Check both call
:func:`is_version`, so they agree on every version.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["MAX_REFERENCE_LENGTH", "is_version", "precedence"]

MAX_REFERENCE_LENGTH: Final = 1024
"""Longer strings are rejected before any regex runs (Python's backtracking, unlike Go's RE2, is
not linear, and no valid reference comes close: name 255 + tag 128 + digest)."""

# KubeEdge's pkg/util/validation regex. Go's \d is ASCII-only and its $ is the true end, hence
# [0-9], re.ASCII and fullmatch.
_VERSION: Final = re.compile(
    r"v(?P<major>[0-9]+)\.(?P<minor>[0-9]+)\.(?P<patch>[0-9]+)(?:-(?P<pre>[a-zA-Z0-9_.]+(?:-[a-zA-Z0-9_.]+)*))?",
    re.ASCII,
)


def is_version(value: str) -> bool:
    """KubeEdge's version format: ``v1.21.0`` or ``v1.21.0-beta.1``."""
    return len(value) <= MAX_REFERENCE_LENGTH and _VERSION.fullmatch(value) is not None


Precedence = tuple[int, int, int, int, tuple[tuple[int, int, str], ...]]


def precedence(value: str) -> Precedence:
    """A sort key ordering versions as Semantic Versioning 2.0 does: ``v1.20.2 < v1.20.3-rc.1 < v1.20.3``
    (a pre-release before its release; its dot-separated identifiers numerically when both are numbers,
    numbers before words).

    Errors: ValueError for a value :func:`is_version` refuses."""
    found = _VERSION.fullmatch(value) if len(value) <= MAX_REFERENCE_LENGTH else None
    if found is None:
        raise ValueError(f"{value!r} is not a version of the form vX.Y.Z or vX.Y.Z-pre")
    pre = found["pre"]
    identifiers = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split(".")) if pre else ()
    return int(found["major"]), int(found["minor"]), int(found["patch"]), 0 if pre else 1, identifiers
