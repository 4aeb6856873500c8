"""Reading a builtin collector's settings from the Task's request data (flat strings, as KubeDiag's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

__all__ = ["RequestError", "choice_key", "int_key", "json_list", "required_key"]


class RequestError(ValueError):
    """A request key a collector reads is missing or malformed; the message names the key."""


def required_key(request: Mapping[str, str], key: str) -> str:
    value = request.get(key, "").strip()
    if not value:
        raise RequestError(f"the request data has no {key!r} (set it in the Diagnosis parameters)")
    return value


def int_key(request: Mapping[str, str], key: str, *, default: int, low: int, high: int) -> int:
    """The integer at ``key`` (``default`` when absent), which must be within ``low``..``high``."""
    text = request.get(key, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise RequestError(f"{key} {text[:40]!r} is not an integer") from None
    if not low <= value <= high:
        raise RequestError(f"{key} {value} is not within {low}..{high}")
    return value


def choice_key(request: Mapping[str, str], key: str, choices: Sequence[str]) -> str:
    """The value at ``key``, one of ``choices`` (the first when absent)."""
    value = request.get(key, "").strip() or choices[0]
    if value not in choices:
        raise RequestError(f"{key} {value[:40]!r} is not one of {', '.join(choices)}")
    return value


def json_list(items: Sequence[object], limit: int) -> tuple[str, int]:
    """The longest prefix of ``items`` whose JSON text has at most ``limit`` bytes, and its length.

    A collector's list stays valid JSON when the Task's results have to be kept small, instead of
    being cut mid-item by the clipping of long values.
    """
    whole = msgspec.json.encode(list(items))
    if len(whole) <= limit:
        return whole.decode(), len(items)
    low, high = 0, len(items)  # the prefix of ``low`` items fits, of ``high`` does not
    while high - low > 1:
        middle = (low + high) // 2
        if len(msgspec.json.encode(list(items[:middle]))) <= limit:
            low = middle
        else:
            high = middle
    return msgspec.json.encode(list(items[:low])).decode(), low
