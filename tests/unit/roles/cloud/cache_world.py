"""A cluster's worth of cached kinds in the in-memory API server, and an edge's view of its cache stream."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import msgspec

from nodetask import cache_chunks
from nodetask.messages import Autonomy, CacheChunk, CacheDeleted, CacheObjects, Downstream, Heartbeat
from roles.kube import Resource
from roles.kube.resources import NODES, SECRETS
from schemas.core import Node, Secret
from schemas.meta import ApiStruct, ObjectMeta
from tests.unit.roles.cloud.doubles import FakeEdge, MemoryApi


class FullMeta(ObjectMeta, frozen=True):
    """Metadata with the API server's bookkeeping, which the hub must not pass on."""

    managed_fields: tuple[dict[str, Any], ...] = ()


class PodDoc(ApiStruct, frozen=True):
    api_version: str = "v1"
    kind: str = "Pod"
    metadata: FullMeta = msgspec.field(default_factory=FullMeta)
    spec: dict[str, Any] = {}


class ConfigMapDoc(ApiStruct, frozen=True):
    api_version: str = "v1"
    kind: str = "ConfigMap"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    data: dict[str, str] = {}


POD_DOCS: Resource[PodDoc] = Resource("v1", "pods", PodDoc, namespaced=True)
CONFIG_MAP_DOCS: Resource[ConfigMapDoc] = Resource("v1", "configmaps", ConfigMapDoc, namespaced=True)
MANAGED = ({"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}},)


def put_node(api: MemoryApi, name: str, annotations: dict[str, str] | None = None) -> Node:
    return api.put(NODES, Node(metadata=ObjectMeta(name=name, annotations=annotations or {})))


def put_pod(
    api: MemoryApi,
    name: str,
    node: str,
    *,
    config_maps: tuple[str, ...] = (),
    secrets: tuple[str, ...] = (),
    env: str = "",
    namespace: str = "default",
    tell: bool = True,
) -> PodDoc:
    """A Pod bound to ``node`` mounting each ConfigMap and Secret named (``env`` sets a plain variable)."""
    volumes = [{"name": f"cm-{c}", "configMap": {"name": c}} for c in config_maps]
    volumes += [{"name": f"s-{s}", "secret": {"secretName": s}} for s in secrets]
    container: dict[str, Any] = {"name": "app", "image": "registry.example/app:1"}
    if env:
        container["env"] = [{"name": "VALUE", "value": env}]
    spec = {"nodeName": node, "containers": [container], "volumes": volumes}
    meta = FullMeta(name=name, namespace=namespace, managed_fields=MANAGED)
    return api.put(POD_DOCS, PodDoc(metadata=meta, spec=spec), tell=tell)


def put_config_map(
    api: MemoryApi, name: str, value: str = "1", namespace: str = "default", *, tell: bool = True
) -> ConfigMapDoc:
    doc = ConfigMapDoc(metadata=ObjectMeta(name=name, namespace=namespace), data={"v": value})
    return api.put(CONFIG_MAP_DOCS, doc, tell=tell)


def put_secret(api: MemoryApi, name: str, namespace: str = "default") -> Secret:
    return api.put(SECRETS, Secret(metadata=ObjectMeta(name=name, namespace=namespace), data={"k": "czE="}))


async def until(check: Callable[[], object], seconds: float = 10) -> None:
    """Wait (polling) until ``check()`` is truthy: for state the hub keeps without an event to wait on."""
    with anyio.fail_after(seconds):
        while True:
            if check():
                return
            await anyio.sleep(0.05)


class Mirror:
    """What an edge's cache would hold, rebuilt from the frames it reads (over what it ``held`` before
    them, if anything), and every frame kept."""

    def __init__(self, edge: FakeEdge, held: dict[str, dict[tuple[str, str], dict[str, Any]]] | None = None) -> None:
        self.edge = edge
        self.objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {k: dict(v) for k, v in (held or {}).items()}
        self.frames: list[Downstream] = []
        self._chunks: dict[str, list[CacheChunk]] = {}
        self.replaces: dict[str, int] = {}
        """Collections replaced, by kind: how many times."""

    async def until(self, done: Callable[[Mirror], bool], seconds: float = 30) -> None:
        """Read frames until ``done`` holds (a test failure after ``seconds``)."""
        with anyio.fail_after(seconds):
            while not done(self):
                self.apply(await self.edge.receive())

    def apply(self, msg: Downstream) -> None:
        if isinstance(msg, Heartbeat):
            return
        self.frames.append(msg)
        match msg:
            case CacheObjects(kind=kind, objects=objects, replace=replace):
                self._store(kind, objects, replace)
            case CacheChunk(kind=kind):
                # The edge's rule (nodetask.cache_chunks): a replace counts once its chunks are all in.
                chunks = self._chunks.setdefault(kind, [])
                chunks.append(msg)
                for done in cache_chunks.reassemble(chunks):
                    chunks.clear()
                    keep = {(k.namespace, k.name) for k in done.kept}
                    kept = {key: obj for key, obj in self.objects.get(kind, {}).items() if key in keep}
                    self._store(kind, done.objects, replace=True)
                    self.objects[kind].update(kept)
            case CacheDeleted(key=key):
                self.objects.get(key.kind, {}).pop((key.namespace, key.name), None)

    def _store(self, kind: str, objects: tuple[msgspec.Raw, ...], replace: bool) -> None:
        kept = self.objects.setdefault(kind, {})
        if replace:
            kept.clear()
            self.replaces[kind] = self.replaces.get(kind, 0) + 1
        for raw in objects:
            obj = msgspec.json.decode(raw)
            meta = obj["metadata"]
            key = (meta.get("namespace", ""), meta["name"])
            old = kept.get(key)
            if old is None or int(old["metadata"]["resourceVersion"]) <= int(meta["resourceVersion"]):
                kept[key] = obj

    def names(self, kind: str) -> set[str]:
        return {name for _, name in self.objects.get(kind, {})}

    def has(self, *kinds: str) -> bool:
        return all(kind in self.replaces for kind in kinds)

    def autonomy(self) -> list[bool]:
        return [f.requested for f in self.frames if isinstance(f, Autonomy)]

    def ever_sent(self, kind: str, name: str) -> bool:
        """Whether any frame carried the object ``kind``/``name``."""
        return any(
            msgspec.json.decode(raw)["metadata"]["name"] == name
            for frame in self.frames
            if isinstance(frame, CacheObjects) and frame.kind == kind
            for raw in frame.objects
        )
