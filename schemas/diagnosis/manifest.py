"""Decode an Operation, OperationSet, Diagnosis or Task, validated once, here (node jobs: :mod:`schemas.manifest`)."""

from __future__ import annotations

import msgspec

from schemas.diagnosis import v1 as diagnosis
from schemas.diagnosis.kinds import DIAGNOSIS_KINDS, DiagnosisKind
from schemas.manifest import ManifestError, decode_document

__all__ = ["decode_diagnosis_object", "diagnosis_kind_of"]


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


def decode_diagnosis_object(document: bytes | str, *, fmt: str = "json") -> diagnosis.DiagnosisObject:
    """Decode an Operation, OperationSet, Diagnosis or Task from JSON or YAML.

    Errors: :class:`ManifestError` naming the field path or the nesting limit, as :func:`decode_job`.
    """
    try:
        obj: diagnosis.DiagnosisObject = decode_document(
            document, fmt, lambda v, k: diagnosis_kind_of(v, k).object_type
        )
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ManifestError(f"invalid {diagnosis.GROUP} object: {exc}") from None
    return obj


def _object_type(api_version: str, kind: str) -> type[diagnosis.DiagnosisObject]:
    return diagnosis_kind_of(api_version, kind).object_type
