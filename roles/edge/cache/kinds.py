"""The kinds of cloud objects a device caches, and its local API serves, as discovery names them.

What a node may cache is Kubernetes' Node authorizer rule: its Node, its Pods, and their ConfigMaps
and Secrets. The cache takes these kinds and no other (:mod:`roles.edge.cache.durable_cache`); the local
API serves them at their paths (:mod:`roles.edge.local_api.paths`).
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
    )
}
