"""What every admission rule is written with: a :class:`Checker` collecting field errors, capped.

The node jobs' rules (:mod:`schemas.validation`) and the diagnosis kinds' (:mod:`schemas.diagnosis.validation`)
read the object as the API server sends it (decoded JSON, not a Struct) through one :class:`Checker`,
name each broken rule at its field path (:class:`FieldError`), stop after :data:`MAX_ERRORS`, and
answer a defaulting with JSON Patch operations (:class:`PatchOperation`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import msgspec

__all__ = [
    "INT32_MAX",
    "MAX_ERRORS",
    "MSGSPEC_PATH",
    "STOPPED",
    "Checker",
    "FieldError",
    "PatchOperation",
    "capped",
    "join",
    "json_type",
    "type_errors",
    "without_nulls",
]

_JSON_TYPES: Final = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"))

MSGSPEC_PATH: Final = re.compile(r"(?s)(?P<message>.*) - at `\$\.?(?P<path>.*)`")

INT32_MAX: Final = 2**31 - 1
"""The largest int32: the bound of the API types' 32-bit integer fields."""

MAX_ERRORS: Final = 20
"""Errors named for one object at most. A person fixes a handful at a time; past that, naming each
bad entry of a long list only makes the answer (and the work) grow with whatever was sent."""


class FieldError(msgspec.Struct, frozen=True, kw_only=True):
    """One broken rule, at a JSON field path such as ``spec.version``; without a path, a remark on the
    errors before it (that there are more)."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


STOPPED: Final = FieldError(path="", message=f"and more: checking stops after the first {MAX_ERRORS} errors")
"""Ends the errors of an object whose checking stopped at :data:`MAX_ERRORS`."""


def capped(errors: Sequence[FieldError]) -> tuple[FieldError, ...]:
    """The first :data:`MAX_ERRORS` of ``errors``, and how many more there were (unchanged if already capped)."""
    if len(errors) <= MAX_ERRORS or (len(errors) == MAX_ERRORS + 1 and not errors[-1].path):
        return tuple(errors)
    return (*errors[:MAX_ERRORS], FieldError(path="", message=f"and {len(errors) - MAX_ERRORS} more"))


class _Enough(Exception):
    """Raised by :meth:`Checker.fail` past :data:`MAX_ERRORS`: the checks stop where they are."""


class PatchOperation(msgspec.Struct, frozen=True, kw_only=True):
    """One RFC 6902 JSON Patch operation, as admission responses carry them."""

    op: str
    path: str
    value: Any


def join(path: str, key: str) -> str:
    """The path of field ``key`` inside ``path`` (the object itself when empty)."""
    return f"{path}.{key}" if path else key


def json_type(value: object) -> str:
    """The JSON name of a decoded value's type, for messages."""
    if value is None:
        return "null"
    # bool before int: bool is a subclass of int in Python, but not a JSON integer.
    for python_type, name in _JSON_TYPES:
        if isinstance(value, python_type):
            return name
    return "object"


class Checker:
    """Collects the errors of one object; each ``check_*`` reads one field and never raises but to stop.

    Run the checks through :meth:`run`: past :data:`MAX_ERRORS` errors, :meth:`fail` ends them (the
    rest of the object is not read) and :meth:`result` says that there was more.
    """

    def __init__(self) -> None:
        self.errors: list[FieldError] = []
        self.stopped = False

    def run(self, check: Callable[..., None], *args: Any) -> tuple[FieldError, ...]:
        """``check(self, *args)``, then :meth:`result`."""
        try:
            check(self, *args)
        except _Enough:
            self.stopped = True
        return self.result()

    def result(self) -> tuple[FieldError, ...]:
        """The errors found, with :data:`STOPPED` last if checking stopped early."""
        return (*self.errors, STOPPED) if self.stopped else tuple(self.errors)

    def fail(self, path: str, message: str) -> None:
        if len(self.errors) >= MAX_ERRORS:
            raise _Enough
        self.errors.append(FieldError(path=path, message=message))

    def typed(self, obj: Mapping[str, Any], key: str, path: str, expected: type, name: str) -> Any:
        """The field's value if present (null counts as absent) and of ``expected`` type, else None."""
        value = obj.get(key)
        if value is None:
            return None
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):  # JSON has no bool ints
            self.fail(join(path, key), f"must be {name}, got {json_type(value)}")
            return None
        return value

    def check_range(self, obj: Mapping[str, Any], key: str, path: str, minimum: int, maximum: int) -> None:
        value = self.typed(obj, key, path, int, "an integer")
        if value is not None and not minimum <= value <= maximum:
            self.fail(f"{path}.{key}", f"must be within [{minimum}, {maximum}] when set, got {value}")


def type_errors(obj: object, object_type: type[Any]) -> list[FieldError]:
    """Whatever the rules did not cover, as msgspec reports it when converting ``obj`` to ``object_type``."""
    try:
        msgspec.convert(obj, type=object_type)
    except msgspec.ValidationError as exc:
        match = MSGSPEC_PATH.fullmatch(str(exc))
        if match is None:
            return [FieldError(path="(object)", message=str(exc))]
        return [FieldError(path=match["path"] or "(object)", message=match["message"])]
    return []


def without_nulls(value: Any) -> Any:
    # Absent and null are the same field to the API types; a client that sends nulls back must not
    # look like it changed the spec.
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value
