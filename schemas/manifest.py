"""Decode a node-job object of any served kind and version, validated once, here.

The decoding itself (:func:`decode_document`) and :class:`ManifestError` serve the diagnosis kinds too
(:mod:`schemas.diagnosis.manifest`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from nodetask import nesting
from schemas.kinds import GROUP, KINDS, Kind

__all__ = ["ManifestError", "decode_document", "decode_job", "kind_of"]


class ManifestError(ValueError):
    """The document is not a valid object of its kind; the message names the field path."""


class _Head(msgspec.Struct, rename="camel"):
    api_version: str = ""
    kind: str = ""


def kind_of(api_version: str, kind: str) -> tuple[Kind, str]:
    """The :class:`Kind` and version for an object's ``apiVersion`` and ``kind``."""
    group, _, version = api_version.partition("/")
    if group != GROUP:
        raise ManifestError(f"apiVersion {api_version!r} is not in the {GROUP} group")
    for k in KINDS:
        if k.kind == kind:
            if version not in k.versions:
                raise ManifestError(f"{kind} is not served at version {version!r} (served: {', '.join(k.versions)})")
            return k, version
    raise ManifestError(f"kind {kind!r} is not a node job (known: {', '.join(k.kind for k in KINDS)})")


def decode_document(document: bytes | str, fmt: str, object_type: Callable[[str, str], type[Any]]) -> Any:
    """Decode one JSON or YAML object into ``object_type(apiVersion, kind)``, its nesting checked first.

    Errors: :class:`msgspec.ValidationError`, or :class:`msgspec.DecodeError` (a
    :class:`~nodetask.nesting.NestingError` past the nesting limit); the callers say what was decoded.
    """
    if fmt == "yaml":
        raw = nesting.load_yaml(document)
        head = msgspec.convert(raw, type=_Head)
        return msgspec.convert(raw, type=object_type(head.api_version, head.kind))
    nesting.check_json(document)
    head = msgspec.json.decode(document, type=_Head)
    return msgspec.json.decode(document, type=object_type(head.api_version, head.kind))


def _job_type(api_version: str, kind: str) -> type[Any]:
    job_kind, version = kind_of(api_version, kind)
    return job_kind.versions[version]


def decode_job(document: bytes | str, *, fmt: str = "json") -> Any:
    """Decode one object from JSON or YAML into the Struct of its kind and version.

    Errors:
        :class:`ManifestError`, e.g. "Expected `int`, got `str` - at `$.spec.concurrency`", or naming
        the nesting limit (``nesting.MAX_DEPTH``).
    """
    try:
        return decode_document(document, fmt, _job_type)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ManifestError(f"invalid node job: {exc}") from None
