"""A created object carries its apiVersion and kind, which the API server needs to create a custom resource."""

from __future__ import annotations

from typing import Any, cast

import msgspec
import structlog

from roles.kube import Kube
from roles.kube.aio import AioApi
from roles.kube.resources import TASKS
from schemas.diagnosis.v1 import Task, TaskSpec
from schemas.meta import ObjectMeta


class EchoApi:
    """Answers a POST with the body it was sent, as the API server answers with the stored object."""

    def __init__(self) -> None:
        self.bodies: list[Any] = []

    async def request(self, method: str, path: str, *, body: bytes = b"", **_: Any) -> bytes:
        self.bodies.append(msgspec.json.decode(body))
        return body


async def _direct(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await fn(*args, **kwargs)


async def test_defaults_the_types_omit_are_still_sent_on_create() -> None:
    """apiVersion and kind are the Task type's defaults, which encoding omits; the POST body has both."""
    api = EchoApi()
    kube = Kube(cast("AioApi", api), log=structlog.get_logger(), cross=_direct)
    task = Task(metadata=ObjectMeta(name="t", namespace="ns"), spec=TaskSpec(operation="o", node_name="n"))
    assert "kind" not in msgspec.json.decode(msgspec.json.encode(task))
    created = await kube.create(TASKS, task, namespace="ns")
    (body,) = api.bodies
    assert (body["apiVersion"], body["kind"]) == ("diagnosis.kubediag.org/v1", "Task")
    assert body["spec"] == {"operation": "o", "nodeName": "n"}
    assert created == task
