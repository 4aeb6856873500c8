"""Decode a node-job object of any served kind and version, validated once, here."""

from __future__ import annotations

from typing import Any

import msgspec

from nodetask import nesting
from schemas.kinds import GROUP, KINDS, Kind

__all__ = ["ManifestError", "decode_job", "kind_of"]


class ManifestError(ValueError):
    """The document is not a valid node job; the message names the field path."""


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


def decode_job(document: bytes | str, *, fmt: str = "json") -> Any:
    """Decode one object from JSON or YAML into the Struct of its kind and version.

    Errors:
        :class:`ManifestError`, e.g. "Expected `int`, got `str` - at `$.spec.concurrency`", or naming
        the nesting limit (``nesting.MAX_DEPTH``).
    """
    try:
        if fmt == "yaml":
            raw = nesting.load_yaml(document)
            head = msgspec.convert(raw, type=_Head)
        else:
            nesting.check_json(document)
            head = msgspec.json.decode(document, type=_Head)
        kind, version = kind_of(head.api_version, head.kind)
        obj_type = kind.versions[version]
        if fmt == "yaml":
            return msgspec.convert(raw, type=obj_type)
        return msgspec.json.decode(document, type=obj_type)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ManifestError(f"invalid node job: {exc}") from None
