"""Where a session's memory goes: the hub's Python heap per session, by source file (tracemalloc).

The ``--only heap`` series of :mod:`bench.run`; its table is in the hub capacity section of the report.
"""

from __future__ import annotations

import functools
import gc
import os
import tracemalloc
from typing import Any

import anyio
import structlog
from prometheus_client import CollectorRegistry

from bench import procs
from bench.cluster import REPO
from bench.hub_process import HEARTBEAT_S
from bench.waits import deadline_for, until_count
from nodetask.clock import Clock
from roles.cloud.hub import Hub, HubSettings
from roles.cloud.metrics import HubMetrics
from roles.common.jobtypes import job_types
from roles.kube import open_kube
from tools.provision.controlplane import ControlPlane


async def heap_profile(cp: ControlPlane, *, sessions: int, seed: str) -> dict[str, Any]:
    """Python heap per session, by source file (tracemalloc), with the hub in this process.

    The same Hub class as the cloud role, run in the benchmark process so that tracemalloc can
    compare the heap before and after ``sessions`` edges connect. tracemalloc counts Python
    allocations only: the rest of the RSS growth is the allocator's overhead and fragmentation,
    and buffers allocated outside Python.
    """
    tracemalloc.start(1)
    log = structlog.get_logger()
    fleet: procs.Fleet | None = None
    try:
        async with open_kube(kubeconfig=str(cp.kubeconfig("cloud")), log=log) as kube:
            settings = HubSettings(hub_id="bench-heap", heartbeat_interval=HEARTBEAT_S, close_grace=2.0)
            hub: Hub
            metrics = HubMetrics(CollectorRegistry(), sessions=lambda: len(hub.sessions), kube=lambda: (0, 0))
            hub = Hub(
                kube=kube, clock=Clock.start(), log=log, settings=settings, job_types=job_types(), metrics=metrics
            )
            async with anyio.create_task_group() as tg:
                port = await tg.start(functools.partial(hub.run, host="127.0.0.1", port=0, ssl_context=None))
                await anyio.sleep(1)
                gc.collect()
                before, rss0 = tracemalloc.take_snapshot(), procs.rss_bytes(os.getpid())
                fleet = await procs.Fleet.spawn(url=f"ws://127.0.0.1:{port}", seed=seed, count=sessions, lean=True)
                await fleet.expect("connected", limit_s=deadline_for(sessions))

                async def writes() -> float:
                    return kube.writes

                await until_count("Nodes marked", writes, sessions, limit_s=deadline_for(sessions))
                await anyio.sleep(3)
                gc.collect()
                after, rss1 = tracemalloc.take_snapshot(), procs.rss_bytes(os.getpid())
                tg.cancel_scope.cancel()
    finally:
        if fleet is not None:
            await fleet.aclose()
        tracemalloc.stop()
    stats = after.compare_to(before, "filename")
    total = sum(s.size_diff for s in stats)
    top = [
        (_short(s.traceback[0].filename), s.size_diff / sessions, s.count_diff / sessions)
        for s in stats[:12]
        if s.size_diff > 0
    ]
    return {
        "sessions": sessions,
        "python_heap_per_session": total / sessions,
        "rss_per_session": (rss1 - rss0) / sessions,
        "top": top,
    }


def _short(filename: str) -> str:
    for marker in ("site-packages/", "/lib/python3.11/", str(REPO) + "/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename
