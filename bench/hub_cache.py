"""Benchmark 2b: the hub's memory per session with cache streams on (seed 003's target: under 50 KiB).

The hub capacity set-up (:mod:`bench.hub_capacity`: the real cloud role in its own process, a
:mod:`bench.fleet` process of edges) with every edge listing ``cache.v1``, in a cluster where each
node has ``pods_per_node`` Pods (namespace ``bench-cache``): every Pod mounts one ConfigMap shared by
all, and each node's first Pod also its own ConfigMap, so that the hub holds one ConfigMap per node
besides the shared one. For each size, a fresh hub and fleet:

1. the hub starts; once its three watches (Nodes, Pods, ConfigMaps) have listed the cluster, its
   RSS is read (the baseline: it includes whatever listing every Pod of the cluster left behind);
2. the fleet connects every edge and waits until each has its Node, Pod and ConfigMap collections
   (the hub lists each node's Pods and Node, and each ConfigMap by name, when its edge connects);
3. after the Nodes are marked and a 3 s settle, RSS again: (RSS - baseline) / sessions.
"""

from __future__ import annotations

import contextlib
import functools
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import anyio
import msgspec

from bench import procs
from bench.cluster import REGISTER_PARALLEL, REPO, node_name
from bench.hub_process import bound_ports, hub_ready, psutil_nofile, read_metrics, wait_metric, write_config
from bench.waits import Stalled, deadline_for
from roles.kube import Conflict, Kube, Resource
from schemas.meta import ApiStruct, ObjectMeta
from tools.processes import role_command, terminate
from tools.provision.controlplane import ControlPlane

NAMESPACE = "bench-cache"
SHARED_CONFIG_MAP = "bench-shared"
WATCHED_KINDS = 3
"""Nodes, Pods and ConfigMaps (Secrets are not cached by default)."""
FLEET_PARALLEL = 50
"""Handshakes the fleet has under way at once (benchmark 2: 200): each session now costs the hub three
lists besides its mark, and on a shared 2-core machine a faster storm only times Hellos out."""


class _Pod(ApiStruct, frozen=True):
    api_version: str = "v1"
    kind: str = "Pod"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: dict[str, Any] = {}


class _ConfigMap(ApiStruct, frozen=True):
    api_version: str = "v1"
    kind: str = "ConfigMap"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    data: dict[str, str] = {}


PODS: Resource[_Pod] = Resource("v1", "pods", _Pod, namespaced=True)
CONFIG_MAPS: Resource[_ConfigMap] = Resource("v1", "configmaps", _ConfigMap, namespaced=True)


def _pod(node: str, index: int) -> _Pod:
    """A Pod as a small workload has it: one container, its env, a ConfigMap volume, a Service's labels."""
    volumes = [{"name": "shared", "configMap": {"name": SHARED_CONFIG_MAP}}]
    if index == 0:
        volumes.append({"name": "own", "configMap": {"name": f"{node}-config"}})
    container = {
        "name": "app",
        "image": "registry.example/fleet/app:1.4.2",
        "env": [{"name": "NODE", "value": node}, {"name": "REPLICA", "value": str(index)}],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
        "volumeMounts": [{"name": v["name"], "mountPath": f"/etc/{v['name']}"} for v in volumes],
    }
    spec = {
        "nodeName": node,
        "automountServiceAccountToken": False,
        "containers": [container],
        "volumes": volumes,
    }
    meta = ObjectMeta(name=f"{node}-p{index}", namespace=NAMESPACE, labels={"app": "bench", "replica": str(index)})
    return _Pod(metadata=meta, spec=spec)


async def ensure_objects(cp: ControlPlane, kube: Kube, *, nodes: int, pods_per_node: int) -> float:
    """Pods and ConfigMaps for nodes 0..nodes-1 (those missing are created); returns seconds taken."""
    started = time.perf_counter()
    for args in (("create", "namespace", NAMESPACE), ("create", "serviceaccount", "default", "-n", NAMESPACE)):
        # Pod admission wants the namespace's default ServiceAccount (the controller manager may not have made it yet).
        await anyio.to_thread.run_sync(functools.partial(cp.kubectl, *args, check=False))
    pods, _, _ = await kube.list(PODS, namespace=NAMESPACE)
    maps, _, _ = await kube.list(CONFIG_MAPS, namespace=NAMESPACE)
    existing = {p.metadata.name for p in pods} | {m.metadata.name for m in maps}
    todo: list[_Pod | _ConfigMap] = []
    if SHARED_CONFIG_MAP not in existing:
        todo.append(
            _ConfigMap(metadata=ObjectMeta(name=SHARED_CONFIG_MAP, namespace=NAMESPACE), data={"level": "info"})
        )
    for i in range(nodes):
        node = node_name(i)
        if f"{node}-config" not in existing:
            meta = ObjectMeta(name=f"{node}-config", namespace=NAMESPACE)
            todo.append(_ConfigMap(metadata=meta, data={"node": node, "site": f"site-{i % 50}"}))
        todo += [_pod(node, j) for j in range(pods_per_node) if f"{node}-p{j}" not in existing]
    limiter = anyio.CapacityLimiter(REGISTER_PARALLEL)

    async def create(obj: _Pod | _ConfigMap) -> None:
        async with limiter:
            with contextlib.suppress(Conflict):
                if isinstance(obj, _Pod):
                    await kube.create(PODS, obj, namespace=NAMESPACE)
                else:
                    await kube.create(CONFIG_MAPS, obj, namespace=NAMESPACE)

    async with anyio.create_task_group() as tg:
        for obj in todo:
            tg.start_soon(create, obj)
    return time.perf_counter() - started


@dataclass(slots=True)
class CacheRun:
    """One hub's measurements with cache streams."""

    sessions: int
    pods_per_node: int
    baseline_rss: int
    nofile: tuple[int, int]
    connect_s: float = 0.0
    cached_s: float = 0.0
    """Fleet start to every edge holding its three collections."""
    cache_frames: float = 0.0
    rss: int = 0
    fleet_rss: int = 0
    relists: float = 0.0
    list_failures: float = 0.0
    config_maps_held: float = 0.0
    listed_s: float = 0.0
    """Hub start to its three watches listed (the cluster's Pods included)."""

    @property
    def per_session_bytes(self) -> float:
        return (self.rss - self.baseline_rss) / self.sessions


async def run_size(
    cp: ControlPlane, *, sessions: int, pods_per_node: int, seed: str, state_dir: Any, index: int
) -> CacheRun:
    """Start a hub process and a caching fleet of ``sessions`` edges, measure, stop both."""
    hub_id = f"bench-cache-{sessions}-{index}"
    cfg, ports_file = state_dir / f"{hub_id}.yaml", state_dir / f"{hub_id}.ports.json"
    write_config(
        cp, cfg, hub_id=hub_id, port=0, http_port=0, cache_streams=True, log_level="warning", ports_file=ports_file
    )
    argv = role_command("cloud", cfg, module="bench.hubproc")
    started = time.perf_counter()
    log = state_dir / f"{hub_id}.log"
    with log.open("wb") as out:
        hub = await anyio.open_process(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    fleet: procs.Fleet | None = None
    try:
        bound = await bound_ports(ports_file, hub)
        port, http_port = bound["listen"], bound["httpListen"]
        await hub_ready(http_port, hub)
        await wait_metric("cache watches listed", http_port, "nodetaskd_hub_cache_watches_listed", WATCHED_KINDS, 600)
        listed_s = time.perf_counter() - started
        await anyio.sleep(2)
        run = CacheRun(
            sessions=sessions,
            pods_per_node=pods_per_node,
            baseline_rss=procs.rss_bytes(hub.pid),
            nofile=psutil_nofile(hub.pid),
            listed_s=listed_s,
        )
        fleet = await procs.Fleet.spawn(
            url=f"ws://127.0.0.1:{port}", seed=seed, count=sessions, cache=True, parallel=FLEET_PARALLEL
        )
        limit = deadline_for(sessions) * 3
        run.connect_s = float((await fleet.expect("connected", limit_s=limit))["seconds"])
        cached = await fleet.expect("cached", limit_s=limit)
        run.cached_s, run.cache_frames = float(cached["seconds"]), float(cached["frames"])
        await wait_metric("Nodes marked", http_port, "nodetaskd_hub_api_writes_total", sessions, limit_s=limit)
        await anyio.sleep(3)
        run.rss = procs.rss_bytes(hub.pid)
        run.fleet_rss = procs.rss_bytes(fleet.pid)
        metrics = await read_metrics(http_port)
        run.relists = metrics.get("nodetaskd_hub_cache_relists_total", 0.0)
        run.list_failures = sum(
            v for k, v in metrics.items() if k.startswith("nodetaskd_hub_cache_list_failures_total")
        )
        run.config_maps_held = metrics.get("nodetaskd_hub_cache_objects:ConfigMap", 0.0)
        return run
    except Exception as exc:
        # The hub's warnings and, if it died, why: the tail of its log.
        tail = " | ".join(log.read_text(errors="replace").splitlines()[-12:])
        raise Stalled(f"{exc}; the hub's last log lines: {tail}") from exc
    finally:
        await terminate(hub, grace=60)
        if fleet is not None:
            await fleet.aclose()
        with anyio.CancelScope(shield=True):
            await hub.aclose()
