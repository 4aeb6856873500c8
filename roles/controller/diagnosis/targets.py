"""Reading a Diagnosis's targets from the API server, for :func:`flows.diagnosis.targets.resolve` to decide.

Nothing is read for a Diagnosis listing more targets than it may have; only pods of its own namespace
are read, and only Nodes the watch has not shown: a few one by one, more in one list of every Node's
metadata, so that made-up names cost the API server one request, not one each.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from typing import Final

import anyio

from flows.diagnosis.targets import Resolution, readable, requested, resolve
from nodetask.names import is_object_name
from roles.controller.diagnosis.caches import slim
from roles.kube import Kube, NotFound
from roles.kube.resources import NODE_HEADS, NODES, PODS
from schemas.core import Node, Pod
from schemas.diagnosis.v1 import Diagnosis

__all__ = ["FEW_UNSEEN", "read_targets"]

FEW_UNSEEN: Final = 8
"""Nodes the watch has not shown that are read one by one; more are looked for in one list of every Node's
metadata. (300 made-up names read one by one kept a loaded API server busy for 45 s, long enough for the
controller's own Lease renewals, queued there behind them, to miss their deadline again and again.)"""


async def read_targets(kube: Kube, diagnosis: Diagnosis, *, nodes: Mapping[str, Node], max_targets: int) -> Resolution:
    """Read what the Diagnosis's one kind of target needs, and resolve it; ``nodes`` is the watch's cache."""
    namespace = diagnosis.metadata.namespace
    targets = diagnosis.spec.targets()
    if requested(targets) > max_targets:
        return resolve(targets, namespace=namespace, max_targets=max_targets)
    found: list[Node] = []
    pods: list[Pod] = []
    # The same precedence as resolve(): only the first kind of target set is read.
    if targets.node_selector is not None:
        found, _, _ = await kube.list(NODES, label_selector=targets.node_selector.to_query())
    elif targets.node_names:
        found = await _existing(kube, nodes, (n for n in targets.node_names if is_object_name(n)))
    elif targets.pod_selector is not None:
        query = targets.pod_selector.to_query()
        pods, _, _ = await kube.list(PODS, label_selector=query, namespace=namespace)
        found = await _existing(kube, nodes, (p.spec.node_name for p in pods if is_object_name(p.spec.node_name)))
    else:
        for ref in readable(targets, namespace=namespace):
            try:
                pods.append(await kube.get(PODS, ref.name, namespace=ref.namespace))
            except NotFound:
                continue
        found = await _existing(kube, nodes, (p.spec.node_name for p in pods if is_object_name(p.spec.node_name)))
    return resolve(targets, namespace=namespace, nodes=found, pods=pods, max_targets=max_targets)


async def _existing(kube: Kube, nodes: Mapping[str, Node], names: Iterable[str]) -> list[Node]:
    """The Nodes among ``names`` that exist: from the watch's cache, or read when it has not shown them
    (a Node created just before the Diagnosis may reach this controller after it)."""
    found: list[Node] = []
    missing: list[str] = []
    for name in dict.fromkeys(names):
        node = nodes.get(name)
        if node is None:
            missing.append(name)
        else:
            found.append(node)

    if len(missing) > FEW_UNSEEN:
        unseen = set(missing)
        listed, _, _ = await kube.list(NODE_HEADS)
        return found + [slim(node) for node in listed if node.metadata.name in unseen]

    async def read(name: str) -> None:
        with contextlib.suppress(NotFound):
            found.append(slim(await kube.get(NODES, name)))

    # The client caps the requests in flight.
    async with anyio.create_task_group() as tg:
        for name in missing:
            tg.start_soon(read, name)
    return found
