"""The kinds of cloud objects a device caches, and its local API serves, as discovery names them.

What a node may cache is Kubernetes' Node authorizer rule: its Node, its Pods, and their ConfigMaps
and Secrets, which the hub's cache streams send; and, when a kubelet works through the device
(:mod:`roles.edge.node_api`), what that kubelet reads besides: its Lease and the Services whose
addresses it gives its pods. The cache takes these kinds and no other
(:mod:`roles.edge.cache.durable_cache`); the local API serves them at their paths
(:mod:`roles.edge.local_api.paths`).
"""

from __future__ import annotations

from typing import Final

import msgspec

__all__ = ["RESOURCES", "Resource"]


class Resource(msgspec.Struct, frozen=True):
    """A kind the device caches and its local API serves, as discovery names it."""

    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    streamed: bool = True
    """The hub's cache streams send it (every kind but those only a kubelet reads through the device)."""
    group: str = ""
    """Its API group; ``""``: the legacy core group, at ``/api/v1``."""
    version: str = "v1"

    @property
    def api_version(self) -> str:
        """As objects name it (``v1``, ``coordination.k8s.io/v1``)."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()


RESOURCES: Final = {
    r.plural: r
    for r in (
        Resource("configmaps", "ConfigMap", namespaced=True, short_names=("cm",)),
        Resource("nodes", "Node", namespaced=False, short_names=("no",)),
        Resource("pods", "Pod", namespaced=True, short_names=("po",)),
        Resource("secrets", "Secret", namespaced=True),
        Resource("services", "Service", namespaced=True, short_names=("svc",), streamed=False),
        Resource("leases", "Lease", namespaced=True, group="coordination.k8s.io", streamed=False),
    )
}
