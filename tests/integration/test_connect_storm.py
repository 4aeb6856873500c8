"""A connect storm on one hub: a thousand edges at once, against the real API server."""

from __future__ import annotations

import resource

import anyio
import pytest

from roles.cloud.hub import Hub
from roles.kube import Kube
from roles.kube.resources import NODES, SECRETS
from schemas.core import AGENT_VERSION_ANNOTATION, HUB_ANNOTATION
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import TOKEN_NAMESPACE, admin, register_edges
from tests.integration.hubs import light_edge, running_hub
from tests.integration.objects import unique

pytestmark = [pytest.mark.integration, pytest.mark.slow(70)]

STORM = 1000
"""Edges connecting at once: enough that their Node marks queue far longer than closeGrace."""
STORM_LABEL = "test.nodetaskd.io/storm"


def _enough_descriptors(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    assert max(soft, hard) >= needed, f"RLIMIT_NOFILE {soft}/{hard}: this test needs {needed} descriptors"


async def test_every_node_of_a_thousand_edges_connecting_at_once_is_marked_and_then_unmarked(
    crds: ControlPlane,
) -> None:
    """All 1,000 edges of a connect storm get their Node marked with the hub and their agent version, and
    when they all leave at once every mark is taken off again, however long the unmarks queue."""
    _enough_descriptors(2 * STORM + 512)  # both ends of every session in this process, and the API clients
    storm = unique("storm")
    nodes = [f"{storm}-{i:04d}" for i in range(STORM)]
    selector = f"{STORM_LABEL}={storm}"
    try:
        tokens = await register_edges(crds, nodes, extra_labels={STORM_LABEL: storm})
        # A long heartbeat keeps the storm about connecting: the hub and the edges share this process.
        # A short closeGrace: the marks queue far longer, and the sessions end quickly at the end.
        async with running_hub(crds, "hub-storm", heartbeat=15.0, close_grace=1.0) as hub:
            async with anyio.create_task_group() as edges:
                async with anyio.create_task_group() as connecting:
                    for node in nodes:
                        edge = light_edge(node, hub.url, tokens[node], version="v7.7.7")
                        connecting.start_soon(edges.start, edge.run)
                async with admin(crds) as kube:
                    marked = await _until_marked(kube, hub.hub, selector)
                assert len(marked) == STORM, f"Nodes marked: {len(marked)} of {STORM}"
                assert {a[HUB_ANNOTATION] for a in marked.values()} == {"hub-storm"}
                assert {a[AGENT_VERSION_ANNOTATION] for a in marked.values()} == {"v7.7.7"}
                edges.cancel_scope.cancel()
            # Every edge left at once while the hub runs on: 1,000 unmarks queue far longer than closeGrace.
            async with admin(crds) as kube:
                still = await _until_unmarked(kube, hub.hub, selector)
            assert still == [], f"Nodes still marked after their sessions ended: {len(still)} of {STORM}"
    finally:
        # Later tests' controllers list every Node of the cluster, and some jobs select them all.
        with anyio.CancelScope(shield=True):
            async with admin(crds) as kube:
                await kube.delete_all(NODES, label_selector=selector)
                await kube.delete_all(SECRETS, label_selector=selector, namespace=TOKEN_NAMESPACE)


async def _until_marked(kube: Kube, hub: Hub, selector: str) -> dict[str, dict[str, str]]:
    """The annotations of the storm's marked Nodes, once all are marked or no mark is left to come."""
    settled = 0
    marked: dict[str, dict[str, str]] = {}
    with anyio.move_on_after(240):
        while True:
            # Read before listing: a mark leaves the book only once the API server has answered it.
            idle = len(hub.marks) == 0 and len(hub.sessions) == STORM
            listed, _, _ = await kube.list(NODES, label_selector=selector)
            marked = {
                n.metadata.name: n.metadata.annotations for n in listed if HUB_ANNOTATION in n.metadata.annotations
            }
            # Idle twice with Nodes unmarked: every session was admitted, and no mark is left to come.
            settled = settled + 1 if idle else 0
            if len(marked) == STORM or settled == 2:
                break
            await anyio.sleep(1.0)
    return marked


async def _until_unmarked(kube: Kube, hub: Hub, selector: str) -> list[str]:
    """The storm's Nodes still marked, once none is or no unmark is left to come."""
    settled = 0
    still: list[str] = []
    with anyio.move_on_after(240):
        while True:
            idle = len(hub.sessions) == 0 and hub.unmarks_pending == 0
            listed, _, _ = await kube.list(NODES, label_selector=selector)
            still = [n.metadata.name for n in listed if HUB_ANNOTATION in n.metadata.annotations]
            settled = settled + 1 if idle else 0
            if not still or settled == 2:
                break
            await anyio.sleep(1.0)
    return still
