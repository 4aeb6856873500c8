"""Which ``updateFields`` keys a ConfigUpdateJob may carry, and how their values are typed (pure).

One set of rules for the admission webhook and the edge agent, which refuses the same keys itself
(a job stored while the webhook was down reaches the agent unchecked). The allowlist itself is the
edge configuration's (``roles.common.config.EdgeConfig.UPDATABLE_FIELDS``), passed in by the caller, since
the API types cannot import the roles.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Final

__all__ = ["MAX_KEY_DEPTH", "MAX_KEY_LENGTH", "NEVER_UPDATABLE", "key_problem", "shown_key", "typed_value"]

MAX_KEY_LENGTH: Final = 128
"""Longer keys are refused before anything else looks at them: no edge setting's path comes close."""
MAX_KEY_DEPTH: Final = 8
"""Names and list indices in one key; deeper keys are refused before they are parsed."""
NEVER_UPDATABLE: Final = "the node's identity, hub connection, credentials, TLS, paths and container runtime never are"

_INTEGER: Final = re.compile(r"-?(0|[1-9][0-9]*)")
_SHOWN: Final = 40


def typed_value(text: str) -> object:
    """``text`` typed as keadm's ``--set`` would.

    ``true``/``false`` are booleans, ``null`` is null, an integer without a leading zero is an
    integer, anything else is a string.
    """
    if text in ("true", "false"):
        return text == "true"
    if text == "null":
        return None
    if _INTEGER.fullmatch(text):
        return int(text)
    return text


def shown_key(key: str) -> str:
    """``key`` quoted for a message, cut short when it is long (the sender chose its length)."""
    if len(key) <= _SHOWN:
        return repr(key)
    return f"{key[:_SHOWN]!r}... ({len(key)} characters)"


def key_problem(key: str, updatable: Collection[str]) -> str:
    """Why a ConfigUpdateJob may not set ``key``, or "" when it may.

    ``updatable`` holds whole top-level names: a path into a setting (``hubUrls[0]``,
    ``a.b``) is only allowed if it is itself listed, which none is.
    """
    if not key:
        return "field paths must not be empty"
    if len(key) > MAX_KEY_LENGTH:
        return f"a field path of {len(key)} characters is longer than the {MAX_KEY_LENGTH} allowed"
    depth = 1 + key.count(".") + key.count("[")
    if depth > MAX_KEY_DEPTH:
        return f"a field path of {depth} parts is deeper than the {MAX_KEY_DEPTH} allowed"
    if key not in updatable:
        return (
            f"{key} is not a setting a ConfigUpdateJob may change: only {', '.join(sorted(updatable)) or 'none'}"
            f" may be ({NEVER_UPDATABLE})"
        )
    return ""
