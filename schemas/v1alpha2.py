"""``operations.kubeedge.io/v1alpha2``: NodeUpgradeJob, ImagePrePullJob and ConfigUpdateJob.

JSON keys are KubeEdge's, quirks included (``imageDigestGatter``, ``imageSecrets``,
``failureTolerate`` as a string). ``failureTolerate`` is kept as its string, checked here once to be
an ASCII decimal within [0, 1] (:func:`~schemas.meta.parse_tolerance`, which also reads it); KubeEdge
parses it at every use and silently treats garbage as 0.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import msgspec

from schemas import v1alpha1
from schemas.meta import (
    ApiStruct,
    ConditionStatus,
    Int32,
    JobPhase,
    LabelSelector,
    NodeTaskPhase,
    ObjectMeta,
    Tolerance,
    UInt32,
    parse_tolerance,
)

Attempt = Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1, extra_json_schema={"format": "int32"})]
"""An attempt number: 1 for a node's (or a job's) first run, one more per retry."""

GROUP = "operations.kubeedge.io"
VERSION = "v1alpha2"
API_VERSION = f"{GROUP}/{VERSION}"


# ---------------------------------------------------------------------------------------------- status


class ActionStatus(ApiStruct, frozen=True):
    """One entry of a node's ``actionFlow``: the result of one action."""

    action: str = ""
    status: ConditionStatus = ConditionStatus.UNKNOWN
    reason: str = ""
    time: str = ""


class PreviousAttempt(ApiStruct, frozen=True):
    """How a node's attempt before the latest retry ended (nodetaskd's addition)."""

    attempt: Attempt = 1
    phase: NodeTaskPhase = NodeTaskPhase.NONE
    """Failure or Unknown: only those are retried."""
    action: str = ""
    """The last action the attempt recorded (empty: it recorded none, e.g. it timed out before Check)."""
    reason: str = ""
    time: str = ""
    """When the attempt ended: its last recorded action's time, else when it was dispatched, else the retry's."""


class PendingEvent(ApiStruct, frozen=True):
    """A Kubernetes Event the controller owes (nodetaskd's addition): the one a retry decision tells."""

    name: str = ""
    """The Event's name: fixed with the decision, so that whichever controller records it creates it once."""
    type: str = ""
    """``Normal`` or ``Warning``."""
    reason: str = ""
    message: str = ""


# Written by the controller in the same status update that sends nodes back to Pending, so that each
# annotation value triggers one retry at most, whichever controller instance sees it and however often.
class RetryStatus(ApiStruct, frozen=True):
    """The job's retries (nodetaskd's addition): what the controller last did with the retry annotation."""

    handled: str = ""
    """The value of ``nodetask.kubeedge.io/retry`` last handled (one already present at creation triggers nothing)."""
    attempt: Attempt = 1
    """The job's run: 1, then one more per retry. A retried node's ``attempt`` is the run it was retried in."""
    time: str = ""
    """When the latest retry began: a retried node that no hub can dispatch times out from here."""
    nodes: int = 0
    """How many nodes the latest retry sent back to Pending."""
    pending_event: PendingEvent | None = None
    """The Event telling what became of the latest handled value, while it is not yet recorded.

    Written in the decision's own status update and cleared once the Event exists, so that a controller
    that dies in between leaves it to the next one, which records it under the same name (once)."""


class NodeCounts(ApiStruct, frozen=True, omit_defaults=False):
    """How many nodes are in each phase (nodetaskd's addition, shown by the printer columns)."""

    total: int = 0
    pending: int = 0
    in_progress: int = 0
    successful: int = 0
    failure: int = 0
    unknown: int = 0


class NodeUpgradeJobNodeTaskStatus(ApiStruct, frozen=True):
    action_flow: tuple[ActionStatus, ...] = ()
    current_version: str = ""
    historic_version: str = ""
    node_name: str = ""
    phase: NodeTaskPhase = NodeTaskPhase.NONE
    reason: str = ""
    dispatch_time: str = ""
    """When a hub dispatched the node task (nodetaskd's addition): node timeouts count from here."""
    attempt: Attempt = 1
    """Which attempt at this node the entry is (nodetaskd's addition; absent: the first)."""
    previous_attempt: PreviousAttempt | None = None
    """How the attempt before this one ended, once the node was retried (nodetaskd's addition)."""
    state: str = ""
    """Deprecated v1alpha1-compatible field."""
    event: str = ""
    """Deprecated v1alpha1-compatible field."""


class NodeUpgradeJobStatus(ApiStruct, frozen=True):
    phase: JobPhase = JobPhase.NONE
    node_status: tuple[NodeUpgradeJobNodeTaskStatus, ...] = ()
    reason: str = ""
    node_counts: NodeCounts | None = None
    retry: RetryStatus | None = None
    # Deprecated v1alpha1-compatible fields, still served by KubeEdge.
    state: str = ""
    current_version: str = ""
    historic_version: str = ""
    time: str = ""
    event: str = ""
    action: str = ""


class ImageStatus(ApiStruct, frozen=True):
    image: str = ""
    status: ConditionStatus = ConditionStatus.UNKNOWN
    reason: str = ""


class ImagePrePullNodeTaskStatus(ApiStruct, frozen=True):
    action_flow: tuple[ActionStatus, ...] = ()
    image_status: tuple[ImageStatus, ...] = ()
    node_name: str = ""
    phase: NodeTaskPhase = NodeTaskPhase.NONE
    reason: str = ""
    dispatch_time: str = ""
    """When a hub dispatched the node task (nodetaskd's addition): node timeouts count from here."""
    attempt: Attempt = 1
    """Which attempt at this node the entry is (nodetaskd's addition; absent: the first)."""
    previous_attempt: PreviousAttempt | None = None
    """How the attempt before this one ended, once the node was retried (nodetaskd's addition)."""


class ImagePrePullJobStatus(ApiStruct, frozen=True):
    phase: JobPhase = JobPhase.NONE
    node_status: tuple[ImagePrePullNodeTaskStatus, ...] = ()
    reason: str = ""
    node_counts: NodeCounts | None = None
    retry: RetryStatus | None = None
    # Deprecated v1alpha1-compatible fields.
    state: str = ""
    time: str = ""
    event: str = ""
    action: str = ""
    status: tuple[v1alpha1.ImagePrePullStatus, ...] = ()


class ConfigUpdateJobNodeTaskStatus(ApiStruct, frozen=True):
    action_flow: tuple[ActionStatus, ...] = ()
    node_name: str = ""
    phase: NodeTaskPhase = NodeTaskPhase.NONE
    reason: str = ""
    dispatch_time: str = ""
    """When a hub dispatched the node task (nodetaskd's addition): node timeouts count from here."""
    attempt: Attempt = 1
    """Which attempt at this node the entry is (nodetaskd's addition; absent: the first)."""
    previous_attempt: PreviousAttempt | None = None
    """How the attempt before this one ended, once the node was retried (nodetaskd's addition)."""


class ConfigUpdateJobStatus(ApiStruct, frozen=True):
    phase: JobPhase = JobPhase.NONE
    node_status: tuple[ConfigUpdateJobNodeTaskStatus, ...] = ()
    reason: str = ""
    node_counts: NodeCounts | None = None
    retry: RetryStatus | None = None


# ---------------------------------------------------------------------------------------------- specs


class RegistryAPI(ApiStruct, frozen=True):
    host: str
    token: str


class ImageDigestGetter(ApiStruct, frozen=True):
    """Expected digests of the upgrade artifact per architecture."""

    arm64: str = ""
    amd64: str = ""
    registry_api: RegistryAPI | None = msgspec.field(default=None, name="registryAPI")


class NodeComponent(StrEnum):
    """What a NodeUpgradeJob upgrades, or a ConfigUpdateJob configures, on its nodes (nodetaskd's addition;
    absent means the agent, as in KubeEdge)."""

    NODETASKD = "nodetaskd"
    """The edge agent itself."""
    KUBELET = "kubelet"
    """The node's kubelet, under whatever supervises it on the device (the agent's ``kubelet`` settings)."""


class NodeUpgradeJobSpec(ApiStruct, frozen=True):
    version: str = ""
    timeout_seconds: UInt32 | None = None
    node_names: tuple[str, ...] = ()
    label_selector: LabelSelector | None = None
    image: str = ""
    image_digest_gatter: ImageDigestGetter | None = None
    concurrency: Int32 = 0
    check_items: tuple[str, ...] = ()
    failure_tolerate: Tolerance | None = None
    require_confirmation: bool = False
    component: NodeComponent = NodeComponent.NODETASKD
    """nodetaskd's addition: ``kubelet`` upgrades the node's kubelet instead of the agent."""
    allow_downgrade: bool = False
    """nodetaskd's addition, for ``component: kubelet``: install a version older than the running one
    (refused otherwise). The key of KubeEdge's samples, which its types no longer read."""

    def __post_init__(self) -> None:
        parse_tolerance(self.failure_tolerate)


class ImagePrePullTemplate(ApiStruct, frozen=True):
    images: tuple[str, ...] = ()
    node_names: tuple[str, ...] = ()
    label_selector: LabelSelector | None = None
    check_items: tuple[str, ...] = ()
    failure_tolerate: Tolerance | None = None
    concurrency: Int32 = 0
    timeout_seconds: UInt32 | None = None
    image_secrets: str = ""
    """``{namespace}/{name}`` of a kubernetes.io/dockerconfigjson Secret."""
    retry_times: Int32 = 0

    def __post_init__(self) -> None:
        parse_tolerance(self.failure_tolerate)


class ImagePrePullJobSpec(ApiStruct, frozen=True):
    image_pre_pull_template: ImagePrePullTemplate = msgspec.field(default_factory=ImagePrePullTemplate)


class ConfigUpdateJobSpec(ApiStruct, frozen=True):
    node_names: tuple[str, ...] = ()
    label_selector: LabelSelector | None = None
    timeout_seconds: UInt32 | None = None
    concurrency: Int32 = 0
    update_fields: dict[str, str] = {}
    failure_tolerate: Tolerance | None = None
    component: NodeComponent = NodeComponent.NODETASKD
    """nodetaskd's addition: ``kubelet`` sets fields of the node's KubeletConfiguration instead of the agent's."""

    def __post_init__(self) -> None:
        parse_tolerance(self.failure_tolerate)


# ---------------------------------------------------------------------------------------------- objects


class NodeUpgradeJob(ApiStruct, frozen=True):
    api_version: str = API_VERSION
    kind: str = "NodeUpgradeJob"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: NodeUpgradeJobSpec = msgspec.field(default_factory=NodeUpgradeJobSpec)
    status: NodeUpgradeJobStatus = msgspec.field(default_factory=NodeUpgradeJobStatus)


class ImagePrePullJob(ApiStruct, frozen=True):
    api_version: str = API_VERSION
    kind: str = "ImagePrePullJob"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: ImagePrePullJobSpec = msgspec.field(default_factory=ImagePrePullJobSpec)
    status: ImagePrePullJobStatus = msgspec.field(default_factory=ImagePrePullJobStatus)


class ConfigUpdateJob(ApiStruct, frozen=True):
    api_version: str = API_VERSION
    kind: str = "ConfigUpdateJob"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: ConfigUpdateJobSpec = msgspec.field(default_factory=ConfigUpdateJobSpec)
    status: ConfigUpdateJobStatus = msgspec.field(default_factory=ConfigUpdateJobStatus)


NodeJob = NodeUpgradeJob | ImagePrePullJob | ConfigUpdateJob
NodeJobSpec = NodeUpgradeJobSpec | ImagePrePullJobSpec | ConfigUpdateJobSpec
NodeJobStatus = NodeUpgradeJobStatus | ImagePrePullJobStatus | ConfigUpdateJobStatus
NodeTaskStatus = NodeUpgradeJobNodeTaskStatus | ImagePrePullNodeTaskStatus | ConfigUpdateJobNodeTaskStatus
