"""The kinds nodetaskd serves, described once.

Everything that differs per kind but is not behaviour (names, versions, finalizer, API types) lives in
:data:`KINDS` for the node jobs, and in :mod:`schemas.diagnosis.kinds` for KubeDiag's diagnosis API;
behaviour lives in ``flows/``. The two are kept apart because every node job shares one status shape,
which code iterating :data:`KINDS` relies on, and the diagnosis kinds do not (and an edge agent, which
knows the node jobs' kinds, never loads the diagnosis objects).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

import msgspec

from schemas import v1alpha1, v1alpha2

GROUP: Final = "operations.kubeedge.io"
CATEGORY: Final = "nodejobs"


class Kind(msgspec.Struct, frozen=True, kw_only=True):
    """Static facts about one custom resource kind."""

    kind: str
    """``NodeUpgradeJob``."""
    plural: str
    """``nodeupgradejobs``: the REST resource name."""
    resource_type: str
    """``nodeupgradejob``: KubeEdge's resource-type string in message routes."""
    short_names: tuple[str, ...]
    versions: MappingProxyType[str, type[msgspec.Struct]]
    """Served versions, oldest first, mapped to their object type; the last one is stored."""
    status_type: type[v1alpha2.NodeJobStatus]
    node_status_type: type[v1alpha2.NodeTaskStatus]
    """The v1alpha2 type of one ``status.nodeStatus`` entry."""

    @property
    def singular(self) -> str:
        return self.resource_type

    @property
    def finalizer(self) -> str:
        """KubeEdge's finalizer for the kind, e.g. ``kubeedge.io/nodeupgradejob-controller``."""
        return f"kubeedge.io/{self.resource_type}-controller"

    @property
    def storage_version(self) -> str:
        return list(self.versions)[-1]

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"


NODE_UPGRADE_JOB: Final = Kind(
    kind="NodeUpgradeJob",
    plural="nodeupgradejobs",
    resource_type="nodeupgradejob",
    short_names=("nuj",),
    versions=MappingProxyType({"v1alpha1": v1alpha1.NodeUpgradeJob, "v1alpha2": v1alpha2.NodeUpgradeJob}),
    status_type=v1alpha2.NodeUpgradeJobStatus,
    node_status_type=v1alpha2.NodeUpgradeJobNodeTaskStatus,
)
IMAGE_PRE_PULL_JOB: Final = Kind(
    kind="ImagePrePullJob",
    plural="imageprepulljobs",
    resource_type="imageprepulljob",
    short_names=("ippj",),
    versions=MappingProxyType({"v1alpha1": v1alpha1.ImagePrePullJob, "v1alpha2": v1alpha2.ImagePrePullJob}),
    status_type=v1alpha2.ImagePrePullJobStatus,
    node_status_type=v1alpha2.ImagePrePullNodeTaskStatus,
)
CONFIG_UPDATE_JOB: Final = Kind(
    kind="ConfigUpdateJob",
    plural="configupdatejobs",
    resource_type="configupdatejob",
    short_names=("cuj",),
    versions=MappingProxyType({"v1alpha2": v1alpha2.ConfigUpdateJob}),
    status_type=v1alpha2.ConfigUpdateJobStatus,
    node_status_type=v1alpha2.ConfigUpdateJobNodeTaskStatus,
)

KINDS: Final = (NODE_UPGRADE_JOB, IMAGE_PRE_PULL_JOB, CONFIG_UPDATE_JOB)


def by_resource_type(resource_type: str) -> Kind:
    """The kind for a route's resource type; raises ``KeyError`` naming the known ones."""
    for k in KINDS:
        if k.resource_type == resource_type:
            return k
    known = ", ".join(k.resource_type for k in KINDS)
    raise KeyError(f"unknown node job type {resource_type!r} (known: {known})")
