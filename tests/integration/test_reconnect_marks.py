"""A fleet reconnecting to a restarted hub: Nodes still marked with that hub and version are not written again."""

from __future__ import annotations

import anyio
import pytest

from roles.kube.resources import NODES
from schemas.core import AGENT_VERSION_ANNOTATION, HUB_ANNOTATION
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import admin, register_edges
from tests.integration.hubs import eventually, light_edge, running_edges, running_hub
from tests.integration.objects import unique

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("cache_streams", [True, False], ids=["shared-node-watch", "own-node-watch"])
async def test_a_reconnect_after_a_restart_writes_only_the_nodes_another_hub_marked(
    crds: ControlPlane, cache_streams: bool
) -> None:
    """A Node still marked by this hub id and version, as a killed hub leaves it, gets no write when its edge
    reconnects; a Node marked by another hub meanwhile is marked again; the skipped mark comes off at the end."""
    kept, moved = unique("kept"), unique("moved")
    tokens = await register_edges(crds, [kept, moved])
    async with admin(crds) as kube:
        for node, holder in ((kept, "hub-r"), (moved, "hub-other")):
            annotations = {HUB_ANNOTATION: holder, AGENT_VERSION_ANNOTATION: "v2.0.0"}
            await kube.merge_patch(NODES, node, {"metadata": {"annotations": annotations}})
        before = (await kube.get(NODES, kept)).metadata.resource_version
        async with running_hub(crds, "hub-r", heartbeat=15.0, cache_streams=cache_streams) as hub:

            def settled(outcome: str) -> float:
                value = hub.registry.get_sample_value("nodetaskd_hub_node_marks_total", {"outcome": outcome})
                return value or 0.0

            edges = [light_edge(node, hub.url, tokens[node], version="v2.0.0") for node in (kept, moved)]
            async with running_edges(edges):
                await eventually(lambda: settled("written") + settled("skipped") == 2)
                assert (settled("written"), settled("skipped")) == (1, 1)
                assert hub.registry.get_sample_value("nodetaskd_hub_api_writes_total") == 1
                assert (await kube.get(NODES, kept)).metadata.resource_version == before
                assert (await kube.get(NODES, moved)).metadata.annotations[HUB_ANNOTATION] == "hub-r"
            # The edges left: both marks come off, the one never written too.
            with anyio.fail_after(20):
                while True:
                    nodes = [await kube.get(NODES, node) for node in (kept, moved)]
                    if not any(HUB_ANNOTATION in node.metadata.annotations for node in nodes):
                        break
                    await anyio.sleep(0.05)
