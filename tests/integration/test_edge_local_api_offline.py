"""A real agent process with ``localApi.enabled`` serves its durable cache while no hub can be reached."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from subprocess import DEVNULL
from typing import Any

import anyio
import msgspec
import pytest
import structlog

from nodetask.messages import CacheObjects
from roles.edge.cache.durable_cache import DurableCache
from roles.edge.store.store import open_store
from tests.integration.agents import agent_command, write_agent_config
from tests.integration.hubs import eventually
from tools.ports import free_port, held
from tools.processes import terminate

NODE = "edge-offline"


def _objects(kind: str, *items: dict[str, Any]) -> CacheObjects:
    return CacheObjects(kind=kind, objects=tuple(msgspec.Raw(msgspec.json.encode(i)) for i in items))


def _call(port: int, path: str, method: str = "GET") -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _answers(port: int) -> bool:
    try:
        _call(port, "/version")
    except OSError:
        return False
    return True


@pytest.fixture
def unreachable() -> Iterator[int]:
    """A loopback port held, not listening, for the test: connecting to it is refused."""
    with held() as port:
        yield port


async def test_the_agent_serves_its_cache_on_the_local_api_with_no_hub(tmp_path: Path, unreachable: int) -> None:
    """Objects cached before a restart are served by the restarted agent, whose hub is unreachable: get,
    list by field selector, and a 403 for a write."""
    data = tmp_path / "data"
    async with open_store(data / "store.sqlite") as store:
        cache = await DurableCache.open(store, data, keep_secrets=False, log=structlog.get_logger())
        await cache.apply(_objects("Node", {"metadata": {"name": NODE, "resourceVersion": "3"}}))
        pod = {
            "metadata": {"name": "web", "namespace": "default", "resourceVersion": "4"},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "busybox"}]},
        }
        await cache.apply(_objects("Pod", pod))
    port = free_port()
    config = write_agent_config(
        tmp_path,
        node=NODE,
        token="t0ken",
        hub_urls=[f"ws://127.0.0.1:{unreachable}"],
        localApi={"enabled": True, "port": port},
    )
    process = await anyio.open_process(agent_command(config), stdout=DEVNULL, stderr=DEVNULL)
    try:
        await eventually(lambda: _answers(port), limit_s=60)
        status, node = await anyio.to_thread.run_sync(_call, port, f"/api/v1/nodes/{NODE}")
        assert (status, node["metadata"]["name"], node["kind"]) == (200, NODE, "Node")
        path = f"/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}"
        status, pods = await anyio.to_thread.run_sync(_call, port, path)
        assert (status, [p["metadata"]["name"] for p in pods["items"]]) == (200, ["web"])
        status, refusal = await anyio.to_thread.run_sync(_call, port, "/api/v1/namespaces/default/pods/web", "DELETE")
        assert (status, refusal["reason"]) == (403, "Forbidden")
        assert process.returncode is None
    finally:
        await terminate(process, grace=10)
