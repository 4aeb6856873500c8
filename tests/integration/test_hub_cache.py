"""Cache streams on the real control plane: a real hub, the test playing the edge over a real websocket."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import trio_websocket

from nodetask import messages
from nodetask.messages import (
    CACHE_CAPABILITY,
    CACHE_SECRETS_CAPABILITY,
    AutonomyCondition,
    CacheDeleted,
    CacheFetch,
    CacheKey,
    CacheObjects,
    Downstream,
    Heartbeat,
    Hello,
    Welcome,
)
from roles.kube import Kube
from roles.kube.resources import EVENTS, NODES
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import admin, register_edges
from tests.integration.hubs import running_hub
from tests.integration.objects import kubectl, unique

pytestmark = pytest.mark.integration

CACHE_SECRETS_RBAC = Path(__file__).resolve().parents[2] / "containers" / "rbac" / "cache-secrets"


@pytest.fixture
def secrets_cached(crds: ControlPlane) -> Iterator[ControlPlane]:
    """The hubs' extra RBAC for cacheSecrets, bound while the test runs."""
    crds.kubectl("apply", "-k", str(CACHE_SECRETS_RBAC))
    try:
        yield crds
    finally:
        crds.kubectl("delete", "-k", str(CACHE_SECRETS_RBAC))


async def _apply(cp: ControlPlane, *docs: dict[str, Any]) -> None:
    await kubectl(cp, "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(docs)}))


def _pod(name: str, node: str, *, config_map: str, secret: str) -> dict[str, Any]:
    container = {
        "name": "app",
        "image": "registry.local/app:1",
        "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": secret, "key": "token"}}}],
    }
    spec = {
        "nodeName": node,
        "automountServiceAccountToken": False,
        "containers": [container],
        "volumes": [{"name": "config", "configMap": {"name": config_map}}],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def _config_map(name: str, value: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default"},
        "data": {"v": value},
    }


def _secret(name: str) -> dict[str, Any]:
    meta = {"name": name, "namespace": "default"}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "stringData": {"token": name}}


class Edge:
    """The test's edge: what it has read of its cache stream."""

    def __init__(self, ws: trio_websocket.WebSocketConnection) -> None:
        self.ws = ws
        self.frames: list[Downstream] = []
        self.objects: dict[str, dict[str, dict[str, Any]]] = {}

    async def send(self, msg: messages.Upstream) -> None:
        await self.ws.send_message(messages.encode(msg))

    async def until(self, done: Callable[[Edge], bool], seconds: float = 30) -> None:
        with anyio.fail_after(seconds):
            while not done(self):
                msg = messages.decode_downstream(await self.ws.get_message())
                if isinstance(msg, Heartbeat):
                    continue
                self.frames.append(msg)
                if isinstance(msg, CacheObjects):
                    kept = self.objects.setdefault(msg.kind, {})
                    if msg.replace:
                        kept.clear()
                    for raw in msg.objects:
                        obj = msgspec.json.decode(raw)
                        kept[obj["metadata"]["name"]] = obj
                elif isinstance(msg, CacheDeleted):
                    self.objects.get(msg.key.kind, {}).pop(msg.key.name, None)

    def replaced(self, *kinds: str) -> bool:
        return all(any(isinstance(f, CacheObjects) and f.replace and f.kind == k for f in self.frames) for k in kinds)


@asynccontextmanager
async def _edge(url: str, node: str, token: str) -> AsyncIterator[Edge]:
    headers = [(b"authorization", f"Bearer {token}".encode())]
    async with trio_websocket.open_websocket_url(f"{url}/nodes/{node}", extra_headers=headers) as ws:
        edge = Edge(ws)
        await edge.send(Hello(node=node, version="v1", capabilities=(CACHE_CAPABILITY, CACHE_SECRETS_CAPABILITY)))
        welcome = messages.decode_downstream(await ws.get_message())
        assert isinstance(welcome, Welcome)
        assert CACHE_CAPABILITY in welcome.capabilities
        async with anyio.create_task_group() as tg:
            tg.start_soon(_beat, edge)
            yield edge
            tg.cancel_scope.cancel()


async def _beat(edge: Edge) -> None:
    while True:
        await edge.send(Heartbeat(sent_at=anyio.current_time()))
        await anyio.sleep(0.3)


async def test_an_edge_gets_its_nodes_pods_config_map_and_secret_and_a_changed_config_map(
    secrets_cached: ControlPlane,
) -> None:
    """The edge gets its Node, its Pod, the ConfigMap and Secret the Pod uses (no managedFields), nothing of
    another node's or unreferenced (even fetched), and the ConfigMap again once it changes."""
    cp = secrets_cached
    node, other = unique("cache"), unique("cache-other")
    tokens = await register_edges(cp, [node])
    cm, secret, free, foreign = unique("cm"), unique("s"), unique("s-free"), unique("s-foreign")
    pod, foreign_pod = unique("pod"), unique("pod-foreign")
    # Pod admission wants the namespace's default ServiceAccount; the controller manager may not have made it yet.
    cp.kubectl("create", "serviceaccount", "default", "-n", "default", check=False)
    await _apply(
        cp,
        _config_map(cm, "1"),
        _secret(secret),
        _secret(free),
        _secret(foreign),
        _pod(pod, node, config_map=cm, secret=secret),
        _pod(foreign_pod, other, config_map=cm, secret=foreign),
    )
    try:
        async with running_hub(cp, "hub-cache", cache_secrets=True) as hub, _edge(hub.url, node, tokens[node]) as edge:
            await edge.until(lambda e: e.replaced("Node", "Pod", "ConfigMap", "Secret"))
            assert set(edge.objects["Node"]) == {node}
            assert set(edge.objects["Pod"]) == {pod}
            assert set(edge.objects["ConfigMap"]) == {cm}
            assert set(edge.objects["Secret"]) == {secret}
            for kind, objects in edge.objects.items():
                for obj in objects.values():
                    assert "managedFields" not in obj["metadata"], kind
                    assert obj["kind"] == kind
            assert edge.objects["Pod"][pod]["spec"]["nodeName"] == node
            fetched = (CacheKey(kind="Secret", namespace="default", name=n) for n in (free, foreign))
            await edge.send(CacheFetch(keys=tuple(fetched)))
            await edge.until(lambda e: sum(isinstance(f, CacheDeleted) for f in e.frames) >= 2)
            await kubectl(cp, "patch", "configmap", cm, "-n", "default", "--type=merge", "-p", '{"data":{"v":"2"}}')
            await edge.until(lambda e: e.objects["ConfigMap"][cm]["data"] == {"v": "2"})
    finally:
        await kubectl(cp, "delete", "-n", "default", "pod", pod, foreign_pod, "--wait=false")
        await kubectl(cp, "delete", "-n", "default", "configmap", cm)
        await kubectl(cp, "delete", "-n", "default", "secret", secret, free, foreign)
    sent = [
        msgspec.json.decode(raw)["metadata"]["name"]
        for f in edge.frames
        if isinstance(f, CacheObjects)
        for raw in f.objects
    ]
    assert not {free, foreign, foreign_pod, other} & set(sent)
    assert [f.key.name for f in edge.frames if isinstance(f, CacheDeleted)] == [free, foreign]


async def test_the_autonomy_condition_an_edge_reports_is_written_on_its_node_with_an_event(
    crds: ControlPlane, cloud_kube: Kube
) -> None:
    """Autonomy True lands on the Node beside its Ready condition, with an AutonomyEnabled Event on the Node."""
    node = unique("autonomy")
    tokens = await register_edges(crds, [node])
    async with running_hub(crds, "hub-autonomy") as hub, _edge(hub.url, node, tokens[node]) as edge:
        await edge.until(lambda e: e.replaced("Node", "Pod", "ConfigMap"))
        await edge.send(AutonomyCondition(status="True", reason="autonomy enabled successfully", message="ok"))
        with anyio.fail_after(20):
            while True:
                conditions = (await cloud_kube.get(NODES, node)).status.conditions
                if any(c.type == "Autonomy" for c in conditions):
                    break
                await anyio.sleep(0.1)
    ready, autonomy = conditions
    assert ready.type == "Ready"
    assert (autonomy.status, autonomy.reason, autonomy.message) == ("True", "autonomy enabled successfully", "ok")
    assert autonomy.last_transition_time
    async with admin(crds) as kube:
        events, _, _ = await kube.list(EVENTS, namespace="default", field_selector=f"involvedObject.name={node}")
    # Not kube-controller-manager's own Events about the Node (RegisteredNode, from its node controller).
    ours = [e for e in events if e.source.component != "node-controller"]
    assert [(e.reason, e.involved_object.kind, e.involved_object.uid) for e in ours] == [
        ("AutonomyEnabled", "Node", node)
    ]
