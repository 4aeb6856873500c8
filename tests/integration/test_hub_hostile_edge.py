"""An edge with a valid token flooding its hub with cache fetches and flapping Autonomy conditions: a real hub
on the real API server, whose requests are counted, stays within its per-session and per-node limits."""

from __future__ import annotations

import math

import anyio
import pytest

from nodetask.messages import CACHE_CAPABILITY, AutonomyCondition, CacheFetch, CacheKey
from roles.cloud.cache.streams import MAX_FETCH_KEYS
from roles.cloud.settings import HubSettings
from roles.kube.resources import NODES
from schemas.core import HUB_ANNOTATION
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import admin, register_edges
from tests.integration.hubs import Sent, eventually, light_edge, recording_kube, running_edges, running_hub
from tests.integration.objects import unique

pytestmark = pytest.mark.integration

FLOOD_S = 12.0
PER_SECOND = 10
"""Frames a second of each kind, as the edge that found this sent them."""


def _node_lists(sent: list[Sent], node: str) -> int:
    """Lists of ``node``'s Node by name (a cache fill or a fetch's read; not a watch)."""
    return sum(
        1
        for s in sent
        if s.answer is not None
        and s.path == "/api/v1/nodes"
        and s.query.get("fieldSelector") == f"metadata.name={node}"
    )


def _condition_requests(sent: list[Sent], node: str) -> tuple[int, int, int]:
    """Reads of ``node``'s Node, patches of its status, and Events created."""
    reads = sum(1 for s in sent if s.method == "GET" and s.path == f"/api/v1/nodes/{node}")
    patches = sum(1 for s in sent if s.method == "PATCH" and s.path == f"/api/v1/nodes/{node}/status")
    events = sum(1 for s in sent if s.method == "POST" and s.path.endswith("/events"))
    return reads, patches, events


async def test_a_hostile_edge_costs_its_hub_a_bounded_number_of_api_requests(crds: ControlPlane) -> None:
    """For 12 s an edge sends ten CacheFetch frames a second of 256 keys naming its own Node, and ten Autonomy
    conditions a second flapping True and Unknown: with the default limits, the hub lists the Node at most once per
    frame its key bucket lets through and writes the condition at most once per interval, refuses the rest with
    rate_limited Errors, keeps the session, and the last condition sent is the one on the Node."""
    node = unique("hostile")
    tokens = await register_edges(crds, [node])
    defaults = HubSettings(hub_id="")
    async with (
        admin(crds) as kube,
        recording_kube(crds, "cloud") as (hub_kube, api),
        running_hub(crds, "hub-hostile", heartbeat=5.0, kube=hub_kube) as hub,
    ):
        edge = light_edge(node, hub.url, tokens[node], capabilities=(CACHE_CAPABILITY,))
        async with running_edges([edge]):
            await eventually(lambda: {"Node", "Pod", "ConfigMap"} <= set(edge.cache_replaces))
            with anyio.fail_after(20):  # the session's Node mark is written before the flood is counted
                while True:
                    if (await kube.get(NODES, node)).metadata.annotations.get(HUB_ANNOTATION) == "hub-hostile":
                        break
                    await anyio.sleep(0.05)
            before = len(api.sent)
            started = anyio.current_time()
            fetch = CacheFetch(keys=(CacheKey(kind="Node", name=node),) * MAX_FETCH_KEYS)
            for i in range(int(FLOOD_S * PER_SECOND)):
                await edge.send(fetch)
                flap = AutonomyCondition(status="Unknown", reason="cache failed", message=f"flap {i}")
                await edge.send(flap if i % 2 else AutonomyCondition(status="True", reason="autonomy enabled"))
                await anyio.sleep(1 / PER_SECOND)
            await edge.send(AutonomyCondition(status="False", reason="autonomy disabled", message="the last word"))
            flooded = anyio.current_time() - started

            with anyio.fail_after(3 * defaults.autonomy_condition_interval):
                while True:
                    conditions = (await kube.get(NODES, node)).status.conditions
                    last = ("Autonomy", "False", "the last word")
                    if any((c.type, c.status, c.message) == last for c in conditions):
                        break
                    await anyio.sleep(0.2)
            spent = api.sent[before:]
            assert edge.connects == 1
            assert edge.connected
    frames = int(FLOOD_S * PER_SECOND)
    accepted = math.floor((defaults.cache_fetch_burst + defaults.cache_fetch_rate * flooded) / MAX_FETCH_KEYS)
    assert _node_lists(spent, node) <= accepted
    limited = [e for e in edge.errors if e.code == "rate_limited"]
    assert len(limited) >= frames - accepted
    assert "cacheFetchRate" in limited[0].message
    # The first condition at once, then one write per interval while they keep coming, then the last one.
    writes = math.ceil(flooded / defaults.autonomy_condition_interval) + 2
    reads, patches, events = _condition_requests(spent, node)
    assert max(reads, patches, events) <= writes, (reads, patches, events)
