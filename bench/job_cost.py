"""Benchmark 1: what one ImagePrePullJob costs the API server, with status coalescing on and off.

A real cloud hub (:class:`roles.cloud.hub.Hub`) and the controller's
:class:`~roles.controller.nodejobs.reconciler.Reconciler` run in this process against the real local
control plane; N light edges run in a fleet process of their own. Once every edge is connected,
a job selecting those N nodes is created (concurrency 100, two images, each action taking
``delay`` seconds on the edge) and timed until the controller sees it Completed. Counted over that
span: the hub's status writes and 409 conflicts (its API client's counters; the hub writes nothing
else while no edge connects or leaves), the controller's writes and conflicts, and CPU seconds of
each process. The final object's size is its compact JSON as the API server serves it.
"""

from __future__ import annotations

import cProfile
import functools
import io
import logging
import os
import pstats
import time
from collections import Counter
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import msgspec
import structlog
from prometheus_client import CollectorRegistry

from bench import procs
from bench.cluster import admin, first_label
from bench.waits import deadline_for, until_count
from nodetask.clock import Clock
from nodetask.phases import JobPhase, NodeTaskPhase
from roles.cloud.hub import Hub, HubSettings
from roles.cloud.metrics import HubMetrics
from roles.common.jobtypes import job_types
from roles.controller.nodejobs.reconciler import Reconciler
from roles.kube import ApiError, Kube, NotFound, open_kube
from roles.kube.resources import job_resource
from schemas.kinds import IMAGE_PRE_PULL_JOB, KINDS
from schemas.meta import LabelSelector
from schemas.v1alpha2 import API_VERSION, ImagePrePullJobSpec, ImagePrePullTemplate
from tools.provision.controlplane import ControlPlane

PREPULLS = job_resource(IMAGE_PRE_PULL_JOB)
CONCURRENCY = 100
IMAGES = ("registry.local/app:1", "registry.local/db:2")
STALL_S = 180.0
FINAL = frozenset({NodeTaskPhase.SUCCESSFUL, NodeTaskPhase.FAILURE, NodeTaskPhase.UNKNOWN})


@dataclass(slots=True)
class JobRun:
    """One job's measurements."""

    nodes: int
    window: float
    completed: bool
    stalled: bool
    """Cut off early: no status change for STALL_S seconds."""
    seconds: float
    """Job creation to the controller seeing it Completed (or to the time limit)."""
    finished_nodes: int
    successful_nodes: int
    hub_writes: int
    hub_conflicts: int
    controller_writes: int
    controller_conflicts: int
    object_bytes: int
    status_bytes: int
    sample_entry: str
    """One node's status entry as stored (compact JSON)."""
    connect_s: float
    cpu_s: dict[str, float] = field(default_factory=dict)
    warnings: dict[str, int] = field(default_factory=dict)
    """Warnings the hub and controller logged during the run, by event."""
    last_errors: dict[str, str] = field(default_factory=dict)

    @property
    def writes_per_node(self) -> float:
        return self.hub_writes / self.nodes


def _job(name: str, nodes: int, timeout_s: int) -> dict[str, Any]:
    template = ImagePrePullTemplate(
        images=IMAGES,
        label_selector=LabelSelector(match_labels={first_label(nodes): ""}),
        concurrency=CONCURRENCY,
        timeout_seconds=timeout_s,
    )
    # apiVersion and kind are defaults of the Struct, which omits defaults: spell them out.
    return {
        "apiVersion": API_VERSION,
        "kind": IMAGE_PRE_PULL_JOB.kind,
        "metadata": {"name": name},
        "spec": msgspec.to_builtins(ImagePrePullJobSpec(image_pre_pull_template=template)),
    }


def _object_size(cp: ControlPlane, name: str) -> tuple[int, int, str]:
    """Bytes of the job's compact JSON and of its status alone, and one node entry as a sample."""
    out = cp.kubectl("get", IMAGE_PRE_PULL_JOB.crd_name, name, "-o", "json", timeout=120).stdout
    doc: dict[str, Any] = msgspec.json.decode(out)
    status = doc.get("status", {})
    entries = status.get("nodeStatus") or [{}]
    return len(msgspec.json.encode(doc)), len(msgspec.json.encode(status)), msgspec.json.encode(entries[0]).decode()


def _hub(kube: Kube, window: float) -> Hub:
    settings = HubSettings(hub_id="bench-hub", coalesce_window=window, close_grace=2.0)
    hub: Hub
    metrics = HubMetrics(CollectorRegistry(), sessions=lambda: len(hub.sessions), kube=lambda: (0, 0))
    log = structlog.get_logger()
    hub = Hub(kube=kube, clock=Clock.start(), log=log, settings=settings, job_types=job_types(), metrics=metrics)
    return hub


async def run_job(
    cp: ControlPlane,
    *,
    nodes: int,
    window: float,
    seed: str,
    delay: float,
    limit_s: float,
    index: int,
    profile: Path | None = None,
) -> JobRun:
    """Connect ``nodes`` edges to a fresh hub, run one job over them, measure it, delete it.

    With ``profile``, the job runs under cProfile (slower: its timings are not comparable) and the
    functions taking the most time in this process are written to that file.
    """
    warnings = capture_warnings()
    log = structlog.get_logger()
    name = f"bench-{nodes}-{'on' if window else 'off'}-{index}-{int(time.time())}"
    key = (IMAGE_PRE_PULL_JOB.plural, name)
    async with (
        open_kube(kubeconfig=str(cp.kubeconfig("cloud")), log=log) as hub_kube,
        open_kube(kubeconfig=str(cp.kubeconfig("controller")), log=log) as ctl_kube,
        admin(cp) as adm,
        anyio.create_task_group() as controller,
    ):
        reconciler = Reconciler(kube=ctl_kube, clock=Clock.start(), log=log, kinds=KINDS)
        await controller.start(reconciler.run)
        hub = _hub(hub_kube, window)
        fleet: procs.Fleet | None = None
        try:
            async with anyio.create_task_group() as hubs:
                port = await hubs.start(functools.partial(hub.run, host="127.0.0.1", port=0, ssl_context=None))
                fleet = await procs.Fleet.spawn(url=f"ws://127.0.0.1:{port}", seed=seed, count=nodes, delay=delay)
                connected = await fleet.expect("connected", limit_s=deadline_for(nodes))

                async def marked() -> float:
                    return hub_kube.writes

                # The hub records each session on its Node after welcoming the edge: let those writes end.
                await until_count("Nodes marked", marked, nodes, limit_s=deadline_for(nodes), interval_s=0.05)
                await anyio.sleep(1.0)
                pids = {"hub+controller": os.getpid(), "edges": fleet.pid, **cp.pids}
                before = (hub_kube.writes, hub_kube.conflicts, ctl_kube.writes, ctl_kube.conflicts)
                cpu0 = procs.cpu_seconds(pids)
                started = anyio.current_time()
                profiler = cProfile.Profile() if profile is not None else None
                if profiler is not None:
                    profiler.enable()
                await adm.create(PREPULLS, _job(name, nodes, timeout_s=int(limit_s) + 60))
                completed, stalled = await _until_final(reconciler, key, limit_s=limit_s)
                seconds = anyio.current_time() - started
                if profiler is not None and profile is not None:
                    profiler.disable()
                    _write_profile(
                        profiler, profile, title=f"one job ({nodes} nodes, window {window}s, {seconds:.0f}s)"
                    )
                cpu = procs.cpu_delta(cpu0, procs.cpu_seconds(pids))
                after = (hub_kube.writes, hub_kube.conflicts, ctl_kube.writes, ctl_kube.conflicts)
                hubs.cancel_scope.cancel()
            job = reconciler.jobs.get(key)
            entries = job.status.node_status if job is not None else ()
            object_bytes, status_bytes, sample = await anyio.to_thread.run_sync(_object_size, cp, name)
            await _delete(adm, name, reconciler, key)
        finally:
            if fleet is not None:
                await fleet.aclose()
            controller.cancel_scope.cancel()
    return JobRun(
        nodes=nodes,
        window=window,
        completed=completed,
        stalled=stalled,
        seconds=seconds,
        finished_nodes=sum(e.phase in FINAL for e in entries),
        successful_nodes=sum(e.phase is NodeTaskPhase.SUCCESSFUL for e in entries),
        hub_writes=after[0] - before[0],
        hub_conflicts=after[1] - before[1],
        controller_writes=after[2] - before[2],
        controller_conflicts=after[3] - before[3],
        object_bytes=object_bytes,
        status_bytes=status_bytes,
        sample_entry=sample,
        connect_s=float(connected["seconds"]),
        cpu_s=cpu,
        warnings=dict(warnings.counts),
        last_errors=dict(warnings.last_error),
    )


def _write_profile(profiler: cProfile.Profile, path: Path, *, title: str) -> None:
    buffer = io.StringIO()
    stats = pstats.Stats(profiler, stream=buffer)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(40)
    path.write_text(f"cProfile of the hub + controller process during {title}\n\n{buffer.getvalue()}")


async def _until_final(reconciler: Reconciler, key: tuple[str, str], *, limit_s: float) -> tuple[bool, bool]:
    """Wait for the job to end: (completed, stalled), stalled meaning no status change for STALL_S."""
    last_version, last_change = "", anyio.current_time()
    with anyio.move_on_after(limit_s):
        while True:
            job = reconciler.jobs.get(key)
            if job is not None:
                if job.status.phase in (JobPhase.COMPLETED, JobPhase.FAILURE):
                    return job.status.phase is JobPhase.COMPLETED, False
                if job.metadata.resource_version != last_version:
                    last_version, last_change = job.metadata.resource_version, anyio.current_time()
                elif anyio.current_time() - last_change > STALL_S:
                    return False, True
            await anyio.sleep(0.05)
    return False, False


class Warnings:
    """A structlog processor that counts the warnings logged (by the hub and controller) and drops them all."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.last_error: dict[str, str] = {}

    def __call__(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> Mapping[str, Any]:
        name = str(event.get("event", ""))
        self.counts[name] += 1
        if "error" in event:
            self.last_error[name] = " ".join(str(event["error"]).split())[:300]
        raise structlog.DropEvent


def capture_warnings() -> Warnings:
    warnings = Warnings()
    structlog.configure(
        processors=[warnings],
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        cache_logger_on_first_use=False,
    )
    return warnings


async def _delete(kube: Kube, name: str, reconciler: Reconciler, key: tuple[str, str]) -> None:
    """Delete the job; never fails the benchmark (a job left behind is logged by the caller's next run)."""
    try:
        # A job past etcd's request limit cannot even be marked for deletion: shrink its status first.
        await kube.merge_patch_raw(PREPULLS, name, {"status": {"nodeStatus": []}}, subresource="status")
        await kube.delete(PREPULLS, name)
    except NotFound:
        return
    except ApiError as exc:
        structlog.get_logger().warning("bench_job_not_deleted", job=name, error=str(exc))
        return
    with anyio.move_on_after(60):
        while key in reconciler.jobs:  # noqa: ASYNC110 - the controller's cache, polled
            await anyio.sleep(0.1)
