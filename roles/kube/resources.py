"""Where each kind of object lives in the API, and its Struct type."""

from __future__ import annotations

import builtins
import enum
import functools
import urllib.parse
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

import msgspec

from nodetask.names import clip
from schemas import certificates, core
from schemas.diagnosis import v1 as diagnosis
from schemas.kinds import GROUP, Kind

T = TypeVar("T", bound=msgspec.Struct)

JSON: Final = "application/json"
_PARTIAL: Final = "application/json;as={};g=meta.k8s.io;v=v1,application/json"
"""Each object's apiVersion, kind and metadata only, as meta.k8s.io/v1 PartialObjectMetadata (served since
Kubernetes 1.15); whole objects from an API server that cannot (their metadata decodes all the same)."""


class MetadataOnly(enum.Enum):
    """Which reads of a resource ask the API server for each object's metadata only (PartialObjectMetadata).

    Listing every Node or Secret of a cluster whole costs the API server and the reader alike; a
    reader of names, versions, labels and annotations needs none of the rest.
    """

    NEVER = "never"
    SNAPSHOT = "snapshot"
    """A watch's snapshot (its list) only; its changes come whole."""
    ALWAYS = "always"
    """Every read: objects, lists, a watch's snapshot and its changes."""


@dataclass(frozen=True, slots=True)
class Resource(Generic[T]):
    """A REST resource: its path pieces and the Struct its objects decode into."""

    api_version: str
    """``v1`` for the core group, else ``group/version``."""
    plural: str
    type: type[T]
    namespaced: bool = False
    snapshot_type: builtins.type[msgspec.Struct] | None = None
    """What a watch's snapshot (its list) decodes items into, when not ``type``: a smaller view, for a
    watcher that needs whole objects only from the changes."""
    metadata_only: MetadataOnly = MetadataOnly.NEVER
    """Which reads bring only each object's metadata: the types they decode into must need no more."""
    priority: bool = False
    """Requests for it never wait behind the client's other requests: they have a few slots of their own
    (``roles.kube.client``). For the leader Lease, whose renewal must not queue behind bulk work."""

    def accept(self, *, collection: bool, snapshot: bool = False) -> str:
        """The ``Accept`` header of a read: of one object or a watch's changes, or of a ``collection`` (a list),
        which is a watch's ``snapshot`` or not."""
        if self.metadata_only is MetadataOnly.ALWAYS or (snapshot and self.metadata_only is MetadataOnly.SNAPSHOT):
            return _PARTIAL.format("PartialObjectMetadataList" if collection else "PartialObjectMetadata")
        return JSON

    def path(self, name: str = "", *, namespace: str = "", subresource: str = "") -> str:
        """The request path; each part is exactly one path segment, whatever it holds.

        Errors: :class:`ValueError` for a part that cannot be one, as the API server's own rule for
        names in paths has it: ``.``, ``..``, or holding ``/`` or ``%``. (Quoting is not enough for
        those: the client resolves dot segments, and the API server decodes ``%2F`` before routing,
        so ``edge-1%2Fstatus`` would name the Node's status subresource.) A namespaced resource
        without a namespace is the collection across all namespaces, to list or watch; anything else
        of it needs a namespace.
        """
        prefix = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and (namespace or name or subresource):
            if not namespace:
                raise ValueError(f"{self.plural} are namespaced: a namespace is required")
            prefix += f"/namespaces/{_segment(namespace, 'namespace')}"
        path = f"{prefix}/{self.plural}"
        if name:
            path += f"/{_segment(name, 'name')}"
        if subresource:
            path += f"/{_segment(subresource, 'subresource')}"
        return path

    def decoder(self) -> msgspec.json.Decoder[T]:
        """The typed decoder of this resource's objects, built once per type (every request uses it)."""
        return _decoder(self.type)

    def snapshot_decoder(self) -> msgspec.json.Decoder[Any]:
        """The decoder of a watch's snapshot items (see ``snapshot_type``)."""
        if self.snapshot_type is None:
            return _decoder(self.type)
        return _decoder(self.snapshot_type)


def _segment(part: str, what: str) -> str:
    # Kubernetes' IsValidPathSegmentName, then quoting, so that nothing else (a '?', a '#', a space)
    # can add a query, drop the rest as a fragment or change the segment.
    if part in (".", "..") or "/" in part or "%" in part:
        raise ValueError(f"{what} {clip(part, 64)!r} cannot be an API path segment (no '.', '..', '/' or '%')")
    return urllib.parse.quote(part, safe="")


@functools.cache
def _decoder(struct: type[T]) -> msgspec.json.Decoder[T]:
    return msgspec.json.Decoder(struct)


def job_resource(kind: Kind, version: str = "") -> Resource[Any]:
    """The resource of a node-job kind at ``version`` (default: the storage version)."""
    version = version or kind.storage_version
    return Resource(api_version=f"{GROUP}/{version}", plural=kind.plural, type=kind.versions[version])


NODES: Resource[core.Node] = Resource("v1", "nodes", core.Node)
SECRETS: Resource[core.Secret] = Resource("v1", "secrets", core.Secret, namespaced=True)
EVENTS: Resource[core.Event] = Resource("v1", "events", core.Event, namespaced=True)
LEASES: Resource[core.Lease] = Resource("coordination.k8s.io/v1", "leases", core.Lease, namespaced=True, priority=True)
PODS: Resource[core.Pod] = Resource("v1", "pods", core.Pod, namespaced=True)
NAMESPACES: Resource[core.Namespace] = Resource("v1", "namespaces", core.Namespace)
CSRS: Resource[certificates.CertificateSigningRequest] = Resource(
    certificates.API_VERSION, "certificatesigningrequests", certificates.CertificateSigningRequest
)
SECRET_HEADS: Resource[core.Secret] = Resource(
    "v1", "secrets", core.Secret, namespaced=True, metadata_only=MetadataOnly.ALWAYS
)
"""Secrets as their metadata only: whether one exists, never what it holds."""

# The kinds an edge's cache holds, kept whole (roles/cloud/cache/objects.py); a watch's snapshot of the
# whole cluster keeps only each object's head, so that listing every Pod never holds them all at once,
# and is listed as metadata only where the head needs no more (a Pod's head needs its spec.nodeName).
# A Node's head also says whose mark it carries (roles/cloud/nodes/marked_nodes.py shares the watch).
_SNAPSHOT: Final = MetadataOnly.SNAPSHOT
RAW_NODES: Resource[core.RawObject] = Resource(
    "v1", "nodes", core.RawObject, snapshot_type=core.NodeHead, metadata_only=_SNAPSHOT
)
RAW_PODS: Resource[core.RawObject] = Resource(
    "v1", "pods", core.RawObject, namespaced=True, snapshot_type=core.ObjectHead
)
RAW_CONFIG_MAPS: Resource[core.RawObject] = Resource(
    "v1", "configmaps", core.RawObject, namespaced=True, snapshot_type=core.ObjectHead, metadata_only=_SNAPSHOT
)
RAW_SECRETS: Resource[core.RawObject] = Resource(
    "v1", "secrets", core.RawObject, namespaced=True, snapshot_type=core.ObjectHead, metadata_only=_SNAPSHOT
)
NODE_METADATA: Resource[core.RawObject] = Resource(
    "v1", "nodes", core.RawObject, snapshot_type=core.NodeHead, metadata_only=MetadataOnly.ALWAYS
)
"""Nodes as their metadata only (the changes undecoded), for a watch of the hubs' marks alone."""
NODE_HEADS: Resource[core.Node] = Resource("v1", "nodes", core.Node, metadata_only=MetadataOnly.ALWAYS)
"""Nodes as their metadata only: which exist, and their labels (whether each is an edge node)."""

OPERATIONS: Resource[diagnosis.Operation] = Resource(diagnosis.API_VERSION, "operations", diagnosis.Operation)
OPERATION_SETS: Resource[diagnosis.OperationSet] = Resource(
    diagnosis.API_VERSION, "operationsets", diagnosis.OperationSet
)
DIAGNOSES: Resource[diagnosis.Diagnosis] = Resource(
    diagnosis.API_VERSION, "diagnoses", diagnosis.Diagnosis, namespaced=True
)
DIAGNOSIS_PARAMETERS: Resource[diagnosis.DiagnosisParameters] = Resource(
    diagnosis.API_VERSION, "diagnoses", diagnosis.DiagnosisParameters, namespaced=True
)
"""Diagnoses read for their parameters only (a hub sending their Tasks)."""
TASKS: Resource[diagnosis.Task] = Resource(diagnosis.API_VERSION, "tasks", diagnosis.Task, namespaced=True)
