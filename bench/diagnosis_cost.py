"""Benchmark 1b: what a two-stage Diagnosis over N nodes costs the API server, next to a job's cost.

The same set-up as :mod:`bench.job_cost`: a real cloud hub (:class:`roles.cloud.hub.Hub`, whose
:mod:`roles.cloud.tasks.watch` sends Tasks) and the controller's
:class:`~roles.controller.diagnosis.diagnoses.DiagnosisController` in this process, on the real local control
plane; N light edges (:mod:`tools.doubles.lightedge`, which answer each Task with a small fixed map:
a double for load) in a fleet process of their own. Once every edge is connected, two Operations and
an OperationSet ``start -> first -> second`` are created (and the controller has found the set ready),
then a Diagnosis of the N nodes by label selector, timed until the controller's cache shows it
Succeeded. Counted over that span, as for a job: the hub's writes (Task status) and the
controller's (Task creations, Diagnosis status and metadata, Events), with their 409s, and CPU
seconds of each process. *Writes per node per stage* is all of them over N x 2. The final
Diagnosis's size is its compact JSON as the API server serves it.
"""

from __future__ import annotations

import cProfile
import functools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import msgspec
import structlog

from bench import procs
from bench.cluster import admin, first_label
from bench.job_cost import _hub, _write_profile, capture_warnings
from bench.waits import Stalled, deadline_for, until_count
from flows.diagnosis.job import TaskRun
from flows.diagnosis.tasks import DIAGNOSIS_UID_LABEL
from nodetask.clock import Clock, parse_time
from roles.controller.diagnosis.diagnoses import DiagnosisController
from roles.kube import ApiError, Kube, NotFound, open_kube
from roles.kube.resources import DIAGNOSES, OPERATION_SETS, OPERATIONS, TASKS
from schemas.diagnosis.v1 import (
    AdjacencyNode,
    Diagnosis,
    DiagnosisPhase,
    DiagnosisSpec,
    Operation,
    OperationSet,
    OperationSetSpec,
    OperationSpec,
    TargetSelector,
)
from schemas.meta import LabelSelector, ObjectMeta
from schemas.processors import Builtin, Processor
from tools.doubles.lightedge import RESULT_PREFIX, double_processor
from tools.provision.controlplane import ControlPlane

NAMESPACE = "default"
STAGES = 2
STALL_S = 180.0
OPERATION_TIMEOUT_S = 600
"""Long: the benchmark measures what a diagnosis costs, not how Tasks time out on a loaded machine."""
FINAL = frozenset({DiagnosisPhase.SUCCEEDED, DiagnosisPhase.FAILED, DiagnosisPhase.UNKNOWN})


@dataclass(slots=True)
class DiagnosisRun:
    """One Diagnosis's measurements."""

    nodes: int
    window: float
    delay: float
    """Seconds each light edge takes over a Task before it reports..."""
    jitter: float
    """... plus up to this many more, fixed per node: results arriving spread out."""
    phase: str
    stalled: bool
    seconds: float
    """Diagnosis creation to the controller's cache showing it ended (or to the time limit)."""
    hub_writes: int
    hub_conflicts: int
    controller_writes: int
    controller_conflicts: int
    object_bytes: int
    context_tasks: int
    """Tasks whose results the final context holds."""
    propagated: bool
    """Every second-stage result the context holds says its request carried the first stage's results."""
    connect_s: float
    timeline: dict[str, float] = field(default_factory=dict)
    """Per stage (its Operation's name in order: ``first``, ``second``), seconds from the Diagnosis's creation
    until its first and last Task were created and until its last Task ended (:func:`_timeline`)."""
    cpu_s: dict[str, float] = field(default_factory=dict)
    warnings: dict[str, int] = field(default_factory=dict)
    last_errors: dict[str, str] = field(default_factory=dict)

    @property
    def writes_per_node_stage(self) -> float:
        return (self.hub_writes + self.controller_writes) / (self.nodes * STAGES)


def _graph(prefix: str) -> tuple[list[Operation], OperationSet]:
    processor = Processor(builtin=Builtin(name="agent.status"), timeout_seconds=OPERATION_TIMEOUT_S)
    names = [f"{prefix}-first", f"{prefix}-second"]
    operations = [Operation(metadata=ObjectMeta(name=n), spec=OperationSpec(processor=processor)) for n in names]
    nodes = (AdjacencyNode(to=(1,)), AdjacencyNode(to=(2,), operation=names[0]), AdjacencyNode(operation=names[1]))
    operation_set = OperationSet(metadata=ObjectMeta(name=prefix), spec=OperationSetSpec(adjacency_list=nodes))
    return operations, operation_set


async def run_diagnosis(
    cp: ControlPlane,
    *,
    nodes: int,
    window: float,
    seed: str,
    delay: float,
    limit_s: float,
    index: int,
    jitter: float = 0.0,
    profile: Path | None = None,
) -> DiagnosisRun:
    """Connect ``nodes`` edges to a fresh hub, run one two-stage Diagnosis over them, measure it, delete it.

    With ``profile``, the Diagnosis runs under cProfile (slower: its timings are not comparable) and the
    functions taking the most time in this process are written to that file.
    """
    warnings = capture_warnings()
    log = structlog.get_logger()
    prefix = f"bench-diag-{nodes}-{index}-{int(time.time())}"
    operations, operation_set = _graph(prefix)
    async with (
        open_kube(kubeconfig=str(cp.kubeconfig("cloud")), log=log) as hub_kube,
        open_kube(kubeconfig=str(cp.kubeconfig("controller")), log=log) as ctl_kube,
        admin(cp) as adm,
        anyio.create_task_group() as controller_group,
    ):
        controller = DiagnosisController(kube=ctl_kube, clock=Clock.start(), log=log)
        await controller_group.start(controller.run)
        hub = _hub(hub_kube, window)
        fleet: procs.Fleet | None = None
        try:
            async with anyio.create_task_group() as hubs:
                port = await hubs.start(functools.partial(hub.run, host="127.0.0.1", port=0, ssl_context=None))
                fleet = await procs.Fleet.spawn(
                    url=f"ws://127.0.0.1:{port}", seed=seed, count=nodes, delay=delay, jitter=jitter
                )
                connected = await fleet.expect("connected", limit_s=deadline_for(nodes))

                async def marked() -> float:
                    return hub_kube.writes

                await until_count("Nodes marked", marked, nodes, limit_s=deadline_for(nodes), interval_s=0.05)
                await _create_graph(adm, operations, operation_set)
                await anyio.sleep(1.0)
                pids = {"hub+controller": os.getpid(), "edges": fleet.pid, **cp.pids}
                before = (hub_kube.writes, hub_kube.conflicts, ctl_kube.writes, ctl_kube.conflicts)
                cpu0 = procs.cpu_seconds(pids)
                started = anyio.current_time()
                profiler = cProfile.Profile() if profile is not None else None
                if profiler is not None:
                    profiler.enable()
                targets = TargetSelector(target_node_selector=LabelSelector(match_labels={first_label(nodes): ""}))
                diagnosis = Diagnosis(
                    metadata=ObjectMeta(name=prefix, namespace=NAMESPACE),
                    spec=DiagnosisSpec(operation_set=prefix, target_selector=targets, parameters={"bench": prefix}),
                )
                await adm.create(DIAGNOSES, diagnosis, namespace=NAMESPACE)
                final, stalled = await _until_final(controller, prefix, limit_s=limit_s)
                seconds = anyio.current_time() - started
                if profiler is not None and profile is not None:
                    profiler.disable()
                    _write_profile(profiler, profile, title=f"a two-stage Diagnosis of {nodes} nodes, {seconds:.0f}s")
                cpu = procs.cpu_delta(cpu0, procs.cpu_seconds(pids))
                after = (hub_kube.writes, hub_kube.conflicts, ctl_kube.writes, ctl_kube.conflicts)
                hubs.cancel_scope.cancel()
            object_bytes = await anyio.to_thread.run_sync(_object_size, cp, prefix)
            timeline = await _timeline(adm, final)
            await _delete(adm, final, operations)
        finally:
            if fleet is not None:
                await fleet.aclose()
            controller_group.cancel_scope.cancel()
    context = final.status.context
    second = context.operations.get(operations[1].metadata.name, {}) if context is not None else {}
    first_keys = str(len(double_processor("", TaskRun(namespace="", name="", operation="", processor=Processor()))))
    return DiagnosisRun(
        nodes=nodes,
        window=window,
        delay=delay,
        jitter=jitter,
        phase=final.status.phase.value,
        stalled=stalled,
        seconds=seconds,
        hub_writes=after[0] - before[0],
        hub_conflicts=after[1] - before[1],
        controller_writes=after[2] - before[2],
        controller_conflicts=after[3] - before[3],
        object_bytes=object_bytes,
        context_tasks=sum(len(tasks) for tasks in context.operations.values()) if context is not None else 0,
        propagated=bool(second) and all(r.get(f"{RESULT_PREFIX}propagatedKeys") == first_keys for r in second.values()),
        connect_s=float(connected["seconds"]),
        timeline=timeline,
        cpu_s=cpu,
        warnings=dict(warnings.counts),
        last_errors=dict(warnings.last_error),
    )


def _object_size(cp: ControlPlane, name: str) -> int:
    """Bytes of the Diagnosis's compact JSON as the API server serves it."""
    out = cp.kubectl("get", "diagnoses.diagnosis.kubediag.org", name, "-n", NAMESPACE, "-o", "json", timeout=120)
    return len(msgspec.json.encode(msgspec.json.decode(out.stdout)))


async def _create_graph(kube: Kube, operations: list[Operation], operation_set: OperationSet) -> None:
    """Create the Operations and the OperationSet, and wait for the controller to find the set ready (a
    Diagnosis of a set it has not seen yet fails)."""
    for operation in operations:
        await kube.create(OPERATIONS, operation)
    await kube.create(OPERATION_SETS, operation_set)
    name = operation_set.metadata.name

    async def ready() -> float:
        return float((await kube.get(OPERATION_SETS, name)).status.ready)

    await until_count(f"OperationSet {name} ready", ready, 1, limit_s=60)


async def _until_final(controller: DiagnosisController, name: str, *, limit_s: float) -> tuple[Diagnosis, bool]:
    """The Diagnosis once the controller's cache shows it ended (or as it is at the time limit), and whether it
    stalled (no change for STALL_S)."""
    key = (NAMESPACE, name)
    last_version, last_change = "", anyio.current_time()
    with anyio.move_on_after(limit_s):
        while True:
            found = controller.diagnoses.get(key)
            if found is not None:
                if found.status.phase in FINAL:
                    return found, False
                if found.metadata.resource_version != last_version:
                    last_version, last_change = found.metadata.resource_version, anyio.current_time()
                elif anyio.current_time() - last_change > STALL_S:
                    return found, True
            await anyio.sleep(0.05)
    found = controller.diagnoses.get(key)
    if found is None:
        raise Stalled(f"the controller never saw the Diagnosis {name} within {limit_s:.0f} s")
    return found, False


async def _timeline(kube: Kube, diagnosis: Diagnosis) -> dict[str, float]:
    """Per stage, seconds from the Diagnosis's creation to its first and last Task's creation and to its last
    Task's end (the API server's timestamps: whole seconds)."""
    t0 = parse_time(diagnosis.metadata.creation_timestamp)
    selector = f"{DIAGNOSIS_UID_LABEL}={diagnosis.metadata.uid}"
    tasks, _, _ = await kube.list(TASKS, label_selector=selector, namespace=NAMESPACE)
    out: dict[str, float] = {}
    for stage, operation in enumerate(sorted({t.spec.operation for t in tasks}), start=1):
        mine = [t for t in tasks if t.spec.operation == operation]
        created = [(parse_time(t.metadata.creation_timestamp) - t0).total_seconds() for t in mine]
        ended = [
            (parse_time(c.last_transition_time) - t0).total_seconds()
            for t in mine
            for c in t.status.conditions
            if c.type in ("Complete", "Failed") and c.last_transition_time
        ]
        out[f"stage {stage} created from"] = min(created)
        out[f"stage {stage} created until"] = max(created)
        out[f"stage {stage} ended until"] = max(ended, default=float("nan"))
    return out


async def _delete(kube: Kube, diagnosis: Diagnosis, operations: list[Operation]) -> None:
    """Delete the Diagnosis and wait until the controller has deleted its Tasks, then the OperationSet and
    Operations; never fails (what is left behind is logged)."""
    name = diagnosis.metadata.name
    try:
        await kube.delete(DIAGNOSES, name, namespace=NAMESPACE)
        selector = f"{DIAGNOSIS_UID_LABEL}={diagnosis.metadata.uid}"

        async def deleted() -> float:
            return -len((await kube.list(TASKS, label_selector=selector, namespace=NAMESPACE))[0])

        limit = deadline_for(diagnosis.status.checkpoint.desired * STAGES if diagnosis.status.checkpoint else 0)
        await until_count("its Tasks deleted (minus those left)", deleted, 0, limit_s=limit, interval_s=0.5)
        await kube.delete(OPERATION_SETS, name)
        for operation in operations:
            await kube.delete(OPERATIONS, operation.metadata.name)
    except NotFound:
        return
    except (ApiError, Stalled) as exc:
        structlog.get_logger().warning("bench_diagnosis_not_deleted", diagnosis=name, error=str(exc))


def sample_dict(run: DiagnosisRun) -> dict[str, Any]:
    """The stored form of a run (its derived figure included)."""
    return {**msgspec.to_builtins(run), "writes_per_node_stage": run.writes_per_node_stage}
