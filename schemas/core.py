"""The few built-in Kubernetes types nodetaskd reads or writes: Node, Pod, Namespace, Lease, Event, Secret, Status.

Only the fields used are typed; the rest of each object is ignored on decoding, so these are never
written back whole (writes are patches or objects nodetaskd creates itself). :class:`RawObject` is
the exception: an object kept whole, to be passed on as the API server served it.
"""

from __future__ import annotations

import msgspec

from schemas.meta import ApiStruct, ObjectMeta

EDGE_ROLE_LABEL = "node-role.kubernetes.io/edge"
"""KubeEdge's edge-node label; its value must be empty."""
HUB_ANNOTATION = "nodetask.kubeedge.io/hub"
"""Which cloud hub instance holds the node's session (absent: none). Written by the hubs."""
AGENT_VERSION_ANNOTATION = "nodetask.kubeedge.io/agent-version"
"""The version of the nodetaskd edge agent on the node, reported in its hello. Written by the hubs."""
CONFIRM_ANNOTATION = "nodetask.kubeedge.io/confirm"
"""On a NodeUpgradeJob: ``*`` or comma-separated node names whose upgrade may pass WaitingConfirmation."""
RETRY_ANNOTATION = "nodetask.kubeedge.io/retry"
"""On any node job: a new value (any string) retries the nodes of a finished job that failed or timed out."""


class NodeCondition(ApiStruct, frozen=True):
    type: str = ""
    status: str = ""
    reason: str = ""
    message: str = ""
    last_heartbeat_time: str | None = None
    last_transition_time: str | None = None


class NodeSystemInfo(ApiStruct, frozen=True):
    kubelet_version: str = ""
    architecture: str = ""


class NodeStatus(ApiStruct, frozen=True):
    conditions: tuple[NodeCondition, ...] = ()
    node_info: NodeSystemInfo | None = None


class Node(ApiStruct, frozen=True):
    api_version: str = "v1"
    kind: str = "Node"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    status: NodeStatus = msgspec.field(default_factory=NodeStatus)

    @property
    def is_edge(self) -> bool:
        """KubeEdge's rule: the edge-role label is present with an empty value."""
        return self.metadata.labels.get(EDGE_ROLE_LABEL) == ""

    @property
    def is_ready(self) -> bool:
        """The Ready condition is True (no conditions means not ready)."""
        return any(c.type == "Ready" and c.status == "True" for c in self.status.conditions)


class Toleration(ApiStruct, frozen=True):
    """``core/v1.Toleration``, all of its fields: a Pod's tolerations are only ever written back whole."""

    key: str = ""
    operator: str = ""
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = None
    """Only with effect ``NoExecute``; absent: tolerated forever."""


class PodSpec(ApiStruct, frozen=True):
    node_name: str = ""
    """The node the pod is bound to; empty until it is scheduled."""
    tolerations: tuple[Toleration, ...] = ()


class Pod(ApiStruct, frozen=True):
    """A pod: read to find the nodes a diagnosis runs on, and to bind its tolerations to its node's autonomy."""

    api_version: str = "v1"
    kind: str = "Pod"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: PodSpec = msgspec.field(default_factory=PodSpec)


class Namespace(ApiStruct, frozen=True):
    """A namespace: read for its labels (whether its Pods opt in to the autonomy binding)."""

    api_version: str = "v1"
    kind: str = "Namespace"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)


class LeaseSpec(ApiStruct, frozen=True):
    holder_identity: str | None = None
    lease_duration_seconds: int | None = None
    acquire_time: str | None = None
    renew_time: str | None = None
    lease_transitions: int | None = None


class Lease(ApiStruct, frozen=True):
    api_version: str = "coordination.k8s.io/v1"
    kind: str = "Lease"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: LeaseSpec = msgspec.field(default_factory=LeaseSpec)


class ObjectReference(ApiStruct, frozen=True):
    api_version: str = ""
    kind: str = ""
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""


class EventSource(ApiStruct, frozen=True):
    component: str = ""
    host: str = ""


class Event(ApiStruct, frozen=True):
    """A core/v1 Event, which ``kubectl describe`` shows under the object."""

    api_version: str = "v1"
    kind: str = "Event"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    involved_object: ObjectReference = msgspec.field(default_factory=ObjectReference)
    reason: str = ""
    message: str = ""
    type: str = "Normal"
    count: int = 1
    first_timestamp: str | None = None
    last_timestamp: str | None = None
    source: EventSource = msgspec.field(default_factory=EventSource)
    reporting_component: str = ""
    reporting_instance: str = ""


class Secret(ApiStruct, frozen=True):
    api_version: str = "v1"
    kind: str = "Secret"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    type: str = ""
    data: dict[str, str] = {}
    """Base64-encoded values, as the API serves them."""


class StatusDetails(ApiStruct, frozen=True):
    name: str = ""
    kind: str = ""


class Status(ApiStruct, frozen=True):
    """The API server's error body."""

    status: str = ""
    message: str = ""
    reason: str = ""
    code: int = 0
    details: StatusDetails | None = None


class RawObject(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A Node, Pod, ConfigMap or Secret kept whole: each top-level field as the API server's JSON.

    These are every top-level field of the four kinds in core/v1; a field the object lacks stays
    unset and is left out again on encoding. List items come without ``apiVersion`` and ``kind``.
    """

    api_version: str | msgspec.UnsetType = msgspec.UNSET
    kind: str | msgspec.UnsetType = msgspec.UNSET
    metadata: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    spec: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    status: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    data: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    binary_data: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    string_data: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    immutable: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    type: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


class HeadMeta(msgspec.Struct, frozen=True, rename="camel"):
    name: str = ""
    namespace: str = ""
    resource_version: str = ""


class HeadSpec(msgspec.Struct, frozen=True, rename="camel"):
    node_name: str = ""


class ObjectHead(msgspec.Struct, frozen=True):
    """What a watch's snapshot of a cached kind keeps of each object: its names, version and (a Pod's) node."""

    metadata: HeadMeta = msgspec.field(default_factory=HeadMeta)
    spec: HeadSpec = msgspec.field(default_factory=HeadSpec)


class MarkAnnotations(msgspec.Struct, frozen=True):
    """A Node's two annotations written by the hubs (None: absent); its other annotations are not decoded."""

    hub: str | None = msgspec.field(default=None, name=HUB_ANNOTATION)
    agent_version: str | None = msgspec.field(default=None, name=AGENT_VERSION_ANNOTATION)


class NodeHeadMeta(HeadMeta, frozen=True):
    annotations: MarkAnnotations = msgspec.field(default_factory=MarkAnnotations)


class NodeHead(ObjectHead, frozen=True):
    """What a watch's snapshot of Nodes keeps of each: its head, and which hub's mark it carries."""

    metadata: NodeHeadMeta = msgspec.field(default_factory=NodeHeadMeta)
