"""Decode a node-job or diagnosis object of any served kind and version, validated once, here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from nodetask import nesting
from schemas.diagnosis import v1 as diagnosis
from schemas.diagnosis.kinds import DIAGNOSIS_KINDS, DiagnosisKind
from schemas.kinds import GROUP, KINDS, Kind

__all__ = ["ManifestError", "decode_diagnosis_object", "decode_job", "diagnosis_kind_of", "kind_of"]


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


def diagnosis_kind_of(api_version: str, kind: str) -> DiagnosisKind:
    """The :class:`DiagnosisKind` for an object's ``apiVersion`` and ``kind``."""
    group, _, version = api_version.partition("/")
    if group != diagnosis.GROUP:
        raise ManifestError(f"apiVersion {api_version!r} is not in the {diagnosis.GROUP} group")
    if version != diagnosis.VERSION:
        raise ManifestError(f"{diagnosis.GROUP} is served at version {diagnosis.VERSION!r} only, not {version!r}")
    for k in DIAGNOSIS_KINDS:
        if k.kind == kind:
            return k
    raise ManifestError(f"kind {kind!r} is not a diagnosis kind (known: {', '.join(k.kind for k in DIAGNOSIS_KINDS)})")


def _decode(document: bytes | str, fmt: str, object_type: Callable[[str, str], type[Any]]) -> Any:
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
        return _decode(document, fmt, _job_type)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ManifestError(f"invalid node job: {exc}") from None


def decode_diagnosis_object(document: bytes | str, *, fmt: str = "json") -> diagnosis.DiagnosisObject:
    """Decode an Operation, OperationSet, Diagnosis or Task from JSON or YAML.

    Errors: :class:`ManifestError` naming the field path or the nesting limit, as :func:`decode_job`.
    """
    try:
        obj: diagnosis.DiagnosisObject = _decode(document, fmt, lambda v, k: diagnosis_kind_of(v, k).object_type)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ManifestError(f"invalid {diagnosis.GROUP} object: {exc}") from None
    return obj
