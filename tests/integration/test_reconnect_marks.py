"""A fleet reconnecting to a restarted hub: Nodes still marked with that hub and version are not written again, and
the hub's start lists the Nodes as their metadata only."""

from __future__ import annotations

import anyio
import msgspec
import pytest

from roles.cloud.transport.auth import TOKEN_LABEL
from roles.kube.resources import NODES
from schemas.core import AGENT_VERSION_ANNOTATION, HUB_ANNOTATION
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import TOKEN_NAMESPACE, admin, register_edges
from tests.integration.hubs import Sent, eventually, light_edge, recording_kube, running_edges, running_hub
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


def _collection_reads(sent: list[Sent], plural: str) -> list[Sent]:
    """The lists of ``plural`` (not one object, not a watch's stream) among ``sent``."""
    return [s for s in sent if s.answer is not None and s.path.endswith(f"/{plural}")]


@pytest.mark.parametrize("cache_streams", [True, False], ids=["shared-node-watch", "own-node-watch"])
async def test_a_restarted_hub_lists_nodes_as_metadata_only_and_still_skips_the_marks_they_carry(
    crds: ControlPlane, cache_streams: bool
) -> None:
    """A hub starting lists the Nodes as their metadata only, and only the labelled token Secrets, never an object's
    spec or status; what the list says of each Node's mark decides the skip; a later change of a mark is seen."""
    kept, moved = unique("meta-kept"), unique("meta-moved")
    tokens = await register_edges(crds, [kept, moved])
    async with admin(crds) as kube:
        for node, holder in ((kept, "hub-meta"), (moved, "hub-other")):
            annotations = {HUB_ANNOTATION: holder, AGENT_VERSION_ANNOTATION: "v2.0.0"}
            await kube.merge_patch(NODES, node, {"metadata": {"annotations": annotations}})
        async with (
            recording_kube(crds, "cloud") as (hub_kube, api),
            running_hub(crds, "hub-meta", heartbeat=15.0, cache_streams=cache_streams, kube=hub_kube) as hub,
        ):
            started = list(api.sent)
            (nodes,) = _collection_reads(started, "nodes")
            assert nodes.accept.startswith("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,")
            listed = msgspec.json.decode(nodes.answer or b"")
            assert listed["kind"] == "PartialObjectMetadataList"
            assert listed["items"], "the cluster has Nodes"
            assert all(set(item) <= {"apiVersion", "kind", "metadata"} for item in listed["items"])
            secrets = _collection_reads(started, "secrets")
            assert [(s.path, s.query.get("labelSelector")) for s in secrets] == [
                (f"/api/v1/namespaces/{TOKEN_NAMESPACE}/secrets", TOKEN_LABEL)
            ]
            if cache_streams:
                (config_maps,) = _collection_reads(started, "configmaps")
                assert msgspec.json.decode(config_maps.answer or b"")["kind"] == "PartialObjectMetadataList"
            else:
                (node_watch,) = [s for s in started if s.answer is None and s.path == "/api/v1/nodes"]
                assert node_watch.accept.startswith("application/json;as=PartialObjectMetadata;")
            assert hub.hub.marked_nodes.seen(kept) == "v2.0.0"

            def settled(outcome: str) -> float:
                value = hub.registry.get_sample_value("nodetaskd_hub_node_marks_total", {"outcome": outcome})
                return value or 0.0

            edges = [light_edge(node, hub.url, tokens[node], version="v2.0.0") for node in (kept, moved)]
            async with running_edges(edges):
                await eventually(lambda: settled("written") + settled("skipped") == 2)
                assert (settled("written"), settled("skipped")) == (1, 1)
                await kube.merge_patch(NODES, kept, {"metadata": {"annotations": {HUB_ANNOTATION: "hub-other"}}})
                await eventually(lambda: hub.hub.marked_nodes.seen(kept) is None)
