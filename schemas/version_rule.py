"""KubeEdge's upgrade version rule, on its own so that the edge agent's Check need not load the webhook's rules.

The admission webhook (:mod:`schemas.validation`) and the agent's NodeUpgradeJob Check both call
:func:`is_version`, so they agree on every version.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["MAX_REFERENCE_LENGTH", "is_version"]

MAX_REFERENCE_LENGTH: Final = 1024
"""Longer strings are rejected before any regex runs (Python's backtracking, unlike Go's RE2, is
not linear, and no valid reference comes close: name 255 + tag 128 + digest)."""

# KubeEdge's pkg/util/validation regex. Go's \d is ASCII-only and its $ is the true end, hence
# [0-9], re.ASCII and fullmatch.
_VERSION: Final = re.compile(r"v[0-9]+\.[0-9]+\.[0-9]+(-[a-zA-Z0-9_.]+(?:-[a-zA-Z0-9_.]+)*)?", re.ASCII)


def is_version(value: str) -> bool:
    """KubeEdge's version format: ``v1.21.0`` or ``v1.21.0-beta.1``."""
    return len(value) <= MAX_REFERENCE_LENGTH and _VERSION.fullmatch(value) is not None
