"""``operations.kubeedge.io/v1alpha1``: the FSM-style NodeUpgradeJob and ImagePrePullJob.

Served (never stored) for compatibility; the spec keys equal v1alpha2's except ``imageDigestGatter``,
whose ``value`` v1alpha2 replaced by per-architecture digests.
"""

from __future__ import annotations

import msgspec

from schemas.meta import ApiStruct, Int32, LabelSelector, ObjectMeta, Tolerance, UInt32, parse_tolerance

VERSION = "v1alpha1"
API_VERSION = f"operations.kubeedge.io/{VERSION}"


class TaskStatus(ApiStruct, frozen=True):
    """A node's FSM status."""

    node_name: str = ""
    state: str = ""
    event: str = ""
    action: str = ""
    reason: str = ""
    time: str = ""


class ImageStatus(ApiStruct, frozen=True):
    image: str = ""
    state: str = ""
    reason: str = ""


class ImagePrePullStatus(ApiStruct, frozen=True):
    node_status: TaskStatus | None = None
    image_status: tuple[ImageStatus, ...] = ()


class RegistryAPI(ApiStruct, frozen=True):
    host: str
    token: str


class ImageDigestGatter(ApiStruct, frozen=True):
    value: str | None = None
    registry_api: RegistryAPI | None = msgspec.field(default=None, name="registryAPI")


class NodeUpgradeJobSpec(ApiStruct, frozen=True):
    version: str = ""
    timeout_seconds: UInt32 | None = None
    node_names: tuple[str, ...] = ()
    label_selector: LabelSelector | None = None
    image: str = ""
    image_digest_gatter: ImageDigestGatter | None = None
    concurrency: Int32 = 0
    check_items: tuple[str, ...] = ()
    failure_tolerate: Tolerance | None = None
    require_confirmation: bool = False

    def __post_init__(self) -> None:
        parse_tolerance(self.failure_tolerate)


class NodeUpgradeJobStatus(ApiStruct, frozen=True):
    state: str = ""
    current_version: str = ""
    historic_version: str = ""
    event: str = ""
    action: str = ""
    reason: str = ""
    time: str = ""
    node_status: tuple[TaskStatus, ...] = ()


class ImagePrePullTemplate(ApiStruct, frozen=True):
    images: tuple[str, ...] = ()
    node_names: tuple[str, ...] = ()
    label_selector: LabelSelector | None = None
    check_items: tuple[str, ...] = ()
    failure_tolerate: Tolerance | None = None
    concurrency: Int32 = 0
    timeout_seconds: UInt32 | None = None
    image_secrets: str = ""
    retry_times: Int32 = 0

    def __post_init__(self) -> None:
        parse_tolerance(self.failure_tolerate)


class ImagePrePullJobSpec(ApiStruct, frozen=True):
    image_pre_pull_template: ImagePrePullTemplate = msgspec.field(default_factory=ImagePrePullTemplate)


class ImagePrePullJobStatus(ApiStruct, frozen=True):
    state: str = ""
    event: str = ""
    action: str = ""
    reason: str = ""
    time: str = ""
    status: tuple[ImagePrePullStatus, ...] = ()


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
