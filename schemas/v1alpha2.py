"""``operations.kubeedge.io/v1alpha2``: NodeUpgradeJob, ImagePrePullJob and ConfigUpdateJob.

JSON keys are KubeEdge's, quirks included (``imageDigestGatter``, ``imageSecrets``,
``failureTolerate`` as a string). ``failureTolerate`` is kept as its string, checked here once to be
an ASCII decimal within [0, 1] (:func:`~schemas.meta.parse_tolerance`, which also reads it); KubeEdge
parses it at every use and silently treats garbage as 0.
"""

from __future__ import annotations

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
    state: str = ""
    """Deprecated v1alpha1-compatible field."""
    event: str = ""
    """Deprecated v1alpha1-compatible field."""


class NodeUpgradeJobStatus(ApiStruct, frozen=True):
    phase: JobPhase = JobPhase.NONE
    node_status: tuple[NodeUpgradeJobNodeTaskStatus, ...] = ()
    reason: str = ""
    node_counts: NodeCounts | None = None
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


class ImagePrePullJobStatus(ApiStruct, frozen=True):
    phase: JobPhase = JobPhase.NONE
    node_status: tuple[ImagePrePullNodeTaskStatus, ...] = ()
    reason: str = ""
    node_counts: NodeCounts | None = None
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


class ConfigUpdateJobStatus(ApiStruct, frozen=True):
    phase: JobPhase = JobPhase.NONE
    node_status: tuple[ConfigUpdateJobNodeTaskStatus, ...] = ()
    reason: str = ""
    node_counts: NodeCounts | None = None


# ---------------------------------------------------------------------------------------------- specs


class RegistryAPI(ApiStruct, frozen=True):
    host: str
    token: str


class ImageDigestGetter(ApiStruct, frozen=True):
    """Expected digests of the upgrade artifact per architecture."""

    arm64: str = ""
    amd64: str = ""
    registry_api: RegistryAPI | None = msgspec.field(default=None, name="registryAPI")


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
