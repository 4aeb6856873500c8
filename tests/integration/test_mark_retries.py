"""Node marks the API server refuses are retried until they land; a Node created after its edge connected is marked."""

from __future__ import annotations

import json
import secrets
from collections.abc import MutableMapping
from typing import Any

import anyio
import anyio.to_thread
import pytest
import structlog.testing

from roles.cloud.transport.auth import token_secret
from roles.kube.resources import NODES, SECRETS
from schemas.core import AGENT_VERSION_ANNOTATION, HUB_ANNOTATION, Node
from schemas.meta import ObjectMeta
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import TOKEN_NAMESPACE, admin, register_edges
from tests.integration.hubs import RunningHub, eventually, light_edge, running_edges, running_hub
from tests.integration.objects import kubectl, unique

pytestmark = pytest.mark.integration

CLOUD_ROLE = "nodetaskd:cloud"


def _settled(hub: RunningHub, outcome: str) -> float:
    return hub.registry.get_sample_value("nodetaskd_hub_node_marks_total", {"outcome": outcome}) or 0.0


async def _until_hubs_may_patch_nodes(cp: ControlPlane, allowed: bool) -> None:
    """Until the API server's authorizer says so (its RBAC cache follows a change within moments)."""
    with anyio.fail_after(20):
        while True:
            answer = await anyio.to_thread.run_sync(
                lambda: cp.kubectl("auth", "can-i", "patch", "nodes", identity="cloud", check=False)
            )
            if (answer.stdout.strip() == "yes") is allowed:
                return
            await anyio.sleep(0.1)


async def forbid_node_patches(cp: ControlPlane) -> None:
    """Take the right to patch Nodes from the hubs' ClusterRole, as while an operator fixes RBAC."""
    role = json.loads((await kubectl(cp, "get", "clusterrole", CLOUD_ROLE, "-o", "json")).stdout)
    for rule in role["rules"]:
        if rule.get("apiGroups") == [""] and rule.get("resources") == ["nodes"]:
            rule["verbs"] = [verb for verb in rule["verbs"] if verb not in ("patch", "update")]
    await kubectl(cp, "replace", "-f", "-", input=json.dumps(role))
    await _until_hubs_may_patch_nodes(cp, allowed=False)


async def restore_rbac(cp: ControlPlane) -> None:
    """``containers/rbac`` again, as every other test expects it."""
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(cp.apply_rbac)
        await _until_hubs_may_patch_nodes(cp, allowed=True)


async def test_a_mark_refused_by_the_api_server_lands_once_the_refusal_ends(crds: ControlPlane) -> None:
    """A hub whose Node patches are forbidden keeps its edge's session and retries the mark, which lands once
    the hub may patch Nodes again: logged once when refused, once when it lands, and counted as written."""
    node = unique("refused")
    tokens = await register_edges(crds, [node])
    with structlog.testing.capture_logs() as logs:
        async with running_hub(crds, "hub-m", heartbeat=15.0) as hub, admin(crds) as kube:

            def logged(event: str) -> list[MutableMapping[str, Any]]:
                return [e for e in logs if e["event"] == event and e.get("node") == node]

            try:
                await forbid_node_patches(crds)
                async with running_edges([light_edge(node, hub.url, tokens[node])]):
                    await eventually(lambda: logged("node_mark_retry_failed"))
                    assert "403" in str(logged("node_not_marked")[0]["error"])
                    assert HUB_ANNOTATION not in (await kube.get(NODES, node)).metadata.annotations
                    await restore_rbac(crds)
                    await eventually(lambda: logged("node_marked"), limit_s=90)
                    annotations = (await kube.get(NODES, node)).metadata.annotations
                    assert (annotations[HUB_ANNOTATION], annotations[AGENT_VERSION_ANNOTATION]) == ("hub-m", "v1.0.0")
                    assert (_settled(hub, "written"), _settled(hub, "failed")) == (1, 0)
                    assert len(logged("node_not_marked")) == 1
            finally:
                await restore_rbac(crds)


async def test_a_node_created_after_its_edge_connected_is_marked_when_it_appears(crds: ControlPlane) -> None:
    """An edge whose token exists but whose Node does not yet keeps its session; its Node is marked once created."""
    node = unique("late")
    token = secrets.token_urlsafe(24)
    async with admin(crds) as kube:
        secret = token_secret(node, token, namespace=TOKEN_NAMESPACE)
        await kube.create(SECRETS, secret, namespace=TOKEN_NAMESPACE)
        with structlog.testing.capture_logs() as logs:
            async with (
                running_hub(crds, "hub-late", heartbeat=15.0) as hub,
                running_edges([light_edge(node, hub.url, token)]),
            ):
                await eventually(lambda: any(e["event"] == "node_not_marked" and e.get("node") == node for e in logs))
                await kube.create(NODES, Node(metadata=ObjectMeta(name=node)))
                await eventually(lambda: _settled(hub, "written") == 1)
                annotations = (await kube.get(NODES, node)).metadata.annotations
                assert (annotations[HUB_ANNOTATION], annotations[AGENT_VERSION_ANNOTATION]) == ("hub-late", "v1.0.0")
