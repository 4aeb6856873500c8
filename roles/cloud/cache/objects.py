"""The objects an edge's cache holds, as the hub reads and sends them: Node, Pod, ConfigMap, Secret.

Objects travel whole, as the API server serves them, less ``metadata.managedFields`` (the server's
bookkeeping of who set which field: often the largest part of an object and of no use on a device),
with ``apiVersion`` and ``kind`` set (list items come without them). Only their names,
resourceVersion, annotations and, for Pods, what :mod:`nodetask.pod_references` reads are decoded.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from nodetask.messages import CacheKey
from nodetask.pod_references import CONFIG_MAP, SECRET, PodSpecRefs, decode_spec
from roles.kube import Resource
from roles.kube.resources import RAW_CONFIG_MAPS, RAW_NODES, RAW_PODS, RAW_SECRETS
from schemas.core import RawObject

__all__ = [
    "CONFIG_MAP",
    "KINDS",
    "NODE",
    "POD",
    "SECRET",
    "Head",
    "Key",
    "cache_key",
    "head",
    "pod_spec",
    "raw_key",
    "version",
    "wire",
]

NODE: Final = "Node"
POD: Final = "Pod"

KINDS: Final[dict[str, Resource[RawObject]]] = {
    NODE: RAW_NODES,
    POD: RAW_PODS,
    CONFIG_MAP: RAW_CONFIG_MAPS,
    SECRET: RAW_SECRETS,
}
"""The cached kinds and where they live in the API."""

Key = tuple[str, str, str]
"""An object's ``(kind, namespace, name)``; the namespace is empty for a Node."""


class _Meta(msgspec.Struct, frozen=True, rename="camel"):
    name: str = ""
    namespace: str = ""
    resource_version: str = ""
    annotations: dict[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Head:
    """What the hub reads of an object's metadata."""

    name: str
    namespace: str
    rv: int
    """Its resourceVersion as a number (0 when it is not one): Kubernetes' are etcd revisions."""
    annotations: dict[str, str]


class _Named(msgspec.Struct, frozen=True):
    metadata: _Meta = msgspec.field(default_factory=_Meta)


_META: Final = msgspec.json.Decoder(_Meta)
_NAMED: Final = msgspec.json.Decoder(_Named)
_PARTS: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ENCODER: Final = msgspec.json.Encoder()
_NO_SPEC: Final = PodSpecRefs()


def version(text: str) -> int:
    """A resourceVersion as a number; 0 for one that is not (never newer than anything)."""
    return int(text) if text.isdigit() else 0


def head(obj: RawObject) -> Head:
    """``obj``'s names, resourceVersion and annotations. Errors: ``msgspec.DecodeError``."""
    meta = _META.decode(obj.metadata) if isinstance(obj.metadata, msgspec.Raw) else _Meta()
    # Namespaces repeat across thousands of Pods: one string each.
    return Head(
        name=meta.name,
        namespace=sys.intern(meta.namespace),
        rv=version(meta.resource_version),
        annotations=meta.annotations or {},
    )


def pod_spec(obj: RawObject) -> PodSpecRefs:
    """A Pod's node and references (see :mod:`nodetask.pod_references`). Errors: ``msgspec.DecodeError``."""
    return decode_spec(obj.spec) if isinstance(obj.spec, msgspec.Raw) else _NO_SPEC


def wire(obj: RawObject, kind: str) -> msgspec.Raw:
    """``obj`` as it goes to an edge: whole but for ``managedFields``, with its ``apiVersion`` and ``kind``."""
    metadata: Any = obj.metadata
    if isinstance(metadata, msgspec.Raw):
        parts = _PARTS.decode(metadata)
        if parts.pop("managedFields", None) is not None:
            metadata = parts
    fixed = msgspec.structs.replace(obj, api_version="v1", kind=kind, metadata=metadata)
    return msgspec.Raw(_ENCODER.encode(fixed))


def raw_key(kind: str, obj: msgspec.Raw) -> CacheKey:
    """The key of ``obj`` as :func:`wire` made it. Errors: ``msgspec.DecodeError``, ``msgspec.ValidationError``."""
    meta = _NAMED.decode(obj).metadata
    return CacheKey(kind=kind, namespace=meta.namespace, name=meta.name)


def cache_key(key: Key) -> CacheKey:
    """The wire form of ``key``."""
    kind, namespace, name = key
    return CacheKey(kind=kind, namespace=namespace, name=name)
