"""Doubles for the nodes room's unit tests: slow, failing, counting and racing API servers."""

from __future__ import annotations

from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import msgspec

from roles.kube import ApiError, Resource
from roles.kube.resources import NODES
from schemas.core import Node, NodeCondition, NodeStatus
from schemas.meta import ObjectMeta
from tests.unit.roles.cloud.doubles import MemoryApi

T = TypeVar("T", bound=msgspec.Struct)
NODE = b'{"metadata": {"name": "n1"}}'


class SlowApi:
    """An API server whose every answer takes ``latency`` seconds; it records the PATCHes it answered."""

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.sent: list[str] = []
        self.answered: list[str] = []

    async def request(self, method: str, path: str, **_: Any) -> bytes:
        self.sent.append(path)
        await anyio.sleep(self.latency)
        self.answered.append(path)
        return NODE


class FlakyNodes:
    """A NodeStore whose first ``refusals`` merge patches fail with a 500; it records each patch's loop time."""

    def __init__(self, refusals: float) -> None:
        self.refusals = refusals
        self.patched: list[float] = []

    async def get(self, resource: Any, name: str, *, namespace: str = "") -> Any:
        raise AssertionError("a mark reads nothing")

    async def merge_patch(self, resource: Any, name: str, patch: dict[str, Any], **_: Any) -> Any:
        await anyio.lowlevel.checkpoint()
        self.patched.append(anyio.current_time())
        if len(self.patched) <= self.refusals:
            raise ApiError(500, "InternalError", "etcdserver: request timed out")
        return None


class CountingApi(MemoryApi):
    """The in-memory API server, counting merge patches tried (on missing objects too)."""

    def __init__(self) -> None:
        super().__init__()
        self.patch_tries = 0

    async def merge_patch(self, resource: Resource[T], name: str, patch: dict[str, Any], **kwargs: Any) -> T:
        self.patch_tries += 1
        return await super().merge_patch(resource, name, patch, **kwargs)


class RacingKubelet(MemoryApi):
    """An API server where the kubelet updates the Node right after the hub's first read of it."""

    raced = False

    async def get(self, resource: Resource[Any], name: str, *, namespace: str = "") -> Any:
        current = await super().get(resource, name, namespace=namespace)
        if resource.plural == "nodes" and not self.raced:
            self.raced = True
            ready = NodeCondition(type="Ready", status="False", reason="KubeletNotReady")
            self.put(NODES, Node(metadata=ObjectMeta(name=name), status=NodeStatus(conditions=(ready,))))
        return current
