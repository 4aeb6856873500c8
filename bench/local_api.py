"""The device's local API: how fast it answers a list from its cache, and what it costs the agent.

    python -m bench.local_api [--requests 2000]

1. Latency: a local API over an in-memory cache, then over the agent's durable cache (its SQLite store),
   each holding the node's Node and 10 Pods (each shaped as the API server sends a Pod: managed
   fields, container statuses, conditions; about 4 KiB of JSON),
   asked ``GET /api/v1/namespaces/default/pods`` and ``GET /api/v1/pods?fieldSelector=spec.nodeName=<node>``
   over one keep-alive loopback connection, one request at a time; the figure is the client's time
   from sending a request to having parsed the whole response (h11), so it includes the client.
2. Memory, each in a fresh interpreter of this virtualenv: the edge role imported (the local API off);
   the local API imported too; and serving that cache after answering 1,000 lists.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import h11
import msgspec
import structlog
import trio

from nodetask.messages import CacheObjects
from roles.edge.cache.durable_cache import DurableCache
from roles.edge.cache.view import CacheView, MemoryCache, Object
from roles.edge.local_api.local_api import LOOPBACK, Serving, serve_local_api
from roles.edge.store.store import open_store

NODE = "bench-edge"
PODS = 10


def realistic_pod(i: int) -> Object:
    """A Pod as the API server lists it, with the fields that make real ones a few KiB."""
    name = f"web-{i:02d}"
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"5f0c8d4e-0000-4000-8000-{i:012d}",
            "resourceVersion": str(100 + i),
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app": "web", "pod-template-hash": "7d9f8b6c5", "tier": "frontend"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "web-7d9f8b6c5",
                    "uid": "0d7b1c1e-0000-4000-8000-000000000001",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-01-01T00:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {"f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}, "f:tier": {}}},
                        "f:spec": {
                            "f:containers": {'k:{"name":"web"}': {".": {}, "f:image": {}, "f:name": {}, "f:ports": {}}},
                            "f:dnsPolicy": {},
                            "f:restartPolicy": {},
                            "f:schedulerName": {},
                            "f:terminationGracePeriodSeconds": {},
                        },
                    },
                },
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-01-01T00:00:05Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:status": {
                            "f:conditions": {'k:{"type":"Ready"}': {".": {}, "f:status": {}, "f:type": {}}},
                            "f:containerStatuses": {},
                            "f:hostIP": {},
                            "f:phase": {},
                            "f:podIP": {},
                            "f:podIPs": {},
                            "f:startTime": {},
                        }
                    },
                },
            ],
        },
        "spec": {
            "nodeName": NODE,
            "containers": [
                {
                    "name": "web",
                    "image": "registry.example/web:1.2.3",
                    "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                    "env": [{"name": "MODE", "value": "edge"}, {"name": "LOG_LEVEL", "value": "info"}],
                    "resources": {
                        "limits": {"cpu": "500m", "memory": "128Mi"},
                        "requests": {"cpu": "100m", "memory": "64Mi"},
                    },
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/web"}],
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "volumes": [{"name": "config", "configMap": {"name": "web-config", "defaultMode": 420}}],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "schedulerName": "default-scheduler",
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
                {
                    "key": "node.kubernetes.io/unreachable",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
            "priority": 0,
            "enableServiceLinks": True,
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": "2026-01-01T00:00:05Z"}
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "hostIP": "192.168.1.10",
            "podIP": f"10.244.0.{i + 2}",
            "podIPs": [{"ip": f"10.244.0.{i + 2}"}],
            "startTime": "2026-01-01T00:00:00Z",
            "containerStatuses": [
                {
                    "name": "web",
                    "state": {"running": {"startedAt": "2026-01-01T00:00:04Z"}},
                    "lastState": {},
                    "ready": True,
                    "restartCount": 0,
                    "image": "registry.example/web:1.2.3",
                    "imageID": "registry.example/web@sha256:" + "0" * 64,
                    "containerID": "containerd://" + "1" * 64,
                    "started": True,
                }
            ],
            "qosClass": "Burstable",
        },
    }


def filled_cache() -> MemoryCache:
    cache = MemoryCache()
    cache.put("Node", {"metadata": {"name": NODE, "resourceVersion": "1"}})
    for pod in PODS_LIST:
        cache.put("Pod", pod)
    return cache


PODS_LIST: list[Object] = [realistic_pod(i) for i in range(PODS)]


class _Client:
    """One keep-alive HTTP/1.1 connection; each request is timed to its whole, parsed response."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._conn = h11.Connection(h11.CLIENT)

    async def get(self, target: str) -> tuple[int, bytes]:
        request = h11.Request(method="GET", target=target, headers=[("host", f"{LOOPBACK}")])
        await self._stream.send_all((self._conn.send(request) or b"") + (self._conn.send(h11.EndOfMessage()) or b""))
        status, body = 0, bytearray()
        while True:
            event = self._conn.next_event()
            if event is h11.NEED_DATA:
                self._conn.receive_data(await self._stream.receive_some(1 << 16))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                self._conn.start_next_cycle()
                return status, bytes(body)


async def _latencies(client: _Client, target: str, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        status, body = await client.get(target)
        times.append(time.perf_counter() - started)
        if status != 200:
            raise RuntimeError(f"GET {target}: {status} {body[:200]!r}")
    return times


async def list_latency(port: int, requests: int) -> dict[str, Any]:
    """Median and tail (ms) of lists of the node's Pods from the local API on ``port``, one at a time."""
    results: dict[str, Any] = {}
    async with await trio.open_tcp_stream(LOOPBACK, port) as stream:
        client = _Client(stream)
        targets = {
            "list pods (namespace)": "/api/v1/namespaces/default/pods",
            "list pods (spec.nodeName)": f"/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}",
        }
        _, body = await client.get(targets["list pods (namespace)"])
        results["response_bytes"] = len(body)
        results["items"] = len(msgspec.json.decode(body)["items"])
        for name, target in targets.items():
            await _latencies(client, target, requests // 10)  # warm up
            times = sorted(await _latencies(client, target, requests))
            results[name] = {
                "median_ms": round(statistics.median(times) * 1000, 3),
                "p90_ms": round(times[int(len(times) * 0.9)] * 1000, 3),
                "p99_ms": round(times[int(len(times) * 0.99)] * 1000, 3),
            }
    return results


@contextlib.asynccontextmanager
async def durable_cache() -> AsyncIterator[DurableCache]:
    """The agent's own cache (its store and ledger in a temporary directory) holding what :func:`filled_cache` does."""
    with tempfile.TemporaryDirectory(prefix="ntd-api-") as tmp:
        async with open_store(Path(tmp) / "store.sqlite") as store:
            cache = await DurableCache.open(store, Path(tmp), keep_secrets=False, log=structlog.get_logger())
            for kind, items in (("Node", [{"metadata": {"name": NODE, "resourceVersion": "1"}}]), ("Pod", PODS_LIST)):
                raw = tuple(msgspec.Raw(msgspec.json.encode(item)) for item in items)
                await cache.apply(CacheObjects(kind=kind, objects=raw, replace=True, resource_version="200"))
            yield cache


async def measure_latency(requests: int, *, durable: bool = False) -> dict[str, Any]:
    """:func:`list_latency` of a local API in this process over the in-memory cache, or the durable one."""
    async with contextlib.AsyncExitStack() as stack:
        cache: CacheView = await stack.enter_async_context(durable_cache()) if durable else filled_cache()
        async with trio.open_nursery() as nursery:
            serving: Serving = await nursery.start(
                functools.partial(serve_local_api, cache, port=0, log=structlog.get_logger())
            )
            results = await list_latency(serving.port, requests)
            nursery.cancel_scope.cancel()
    return results


_RSS_PROBE = """
import psutil, sys
{imports}
{run}
print(psutil.Process().memory_info().rss)
"""
_SERVE = """
import trio, structlog
from bench.local_api import measure_latency
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
trio.run(measure_latency, 1000)
"""


def _rss_mib(imports: str, run: str = "") -> float:
    code = _RSS_PROBE.format(imports=imports, run=run)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return round(int(out.strip().splitlines()[-1]) / 2**20, 2)


def measure_memory() -> dict[str, float]:
    """RSS (MiB) of fresh interpreters: the edge role alone, with the local API imported, and serving."""
    runs = {
        "edge role imported (local API off)": ("import roles.edge.role", ""),
        "+ local API imported": ("import roles.edge.role\nimport roles.edge.local_api.local_api", ""),
        "+ serving 10 Pods, after 2 x 1,100 lists": (
            "import roles.edge.role\nimport roles.edge.local_api.local_api",
            _SERVE,
        ),
    }
    # The median of three fresh interpreters each, as allocator arenas make single readings jumpy.
    return {name: statistics.median(_rss_mib(imports, run) for _ in range(3)) for name, (imports, run) in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    lines = []
    for label, durable in (("in-memory cache", False), ("durable cache (the agent's SQLite store)", True)):
        latency = trio.run(functools.partial(measure_latency, args.requests, durable=durable))
        size = f"{latency['items']} Pods, {latency['response_bytes']} bytes"
        lines.append(f"{label}: list of {size}, {args.requests} requests each:")
        for name in ("list pods (namespace)", "list pods (spec.nodeName)"):
            figures = latency[name]
            lines.append(
                f"  {name}: median {figures['median_ms']} ms, p90 {figures['p90_ms']} ms, p99 {figures['p99_ms']} ms"
            )
    lines.append("RSS of fresh interpreters (median of 3; the last includes the measuring client):")
    lines += [f"  {name}: {mib} MiB" for name, mib in measure_memory().items()]
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
