"""The diagnosis controller's I/O shell: watch the five kinds, one serial worker per object, write decisions.

Nodes, Operations, OperationSets, Diagnoses and Tasks are watched into caches (of a Node, only its
name and labels: a Diagnosis's Tasks are for existing edge Nodes only, :mod:`flows.diagnosis.targets`).
A Diagnosis's worker passes when the Diagnosis, one of its Tasks, its OperationSet or any Operation
changes, or when its next deadline comes (a Task's timeout, its TTL); each pass asks
:mod:`flows.diagnosis.run` what to do and does it, in an order that a crash at any point leaves
resumable: metadata (the graph's hash, the pods), then the status (written conditionally, re-decided
on a fresh copy after a conflict), then the Tasks the written status asks for. The controller is the
only writer of a Diagnosis's status; the hubs write Tasks' status, and the controller writes a
Task's only to declare it Unknown, on a fresh copy that has no result yet.

Deletion: a Task keeps its finalizer while its Diagnosis exists. Once the Diagnosis is gone (or
being deleted), its worker takes the finalizer off each Task and deletes it, so deleting a Diagnosis
removes its Tasks with or without the garbage collector; Tasks whose Diagnosis went away while no
controller ran are found at the first list.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any

import anyio
import anyio.abc
import msgspec
import structlog

from flows.diagnosis.pipeline import BrokenGraph, Pipeline, pipeline_of
from flows.diagnosis.run import (
    advance,
    awaiting_operation_set,
    fail_too_large,
    parameters_problem,
    progress_only,
    start,
)
from flows.diagnosis.stages import PODS_ANNOTATION
from flows.diagnosis.step import FINAL_PHASES, Notice, Step, World
from flows.diagnosis.targets import Resolution, readable, requested, resolve
from flows.diagnosis.tasks import TASK_FINALIZER, owner_of, timed_out
from nodetask.clock import Clock, format_time
from nodetask.names import is_object_name
from roles.common.events import object_event, record_event
from roles.controller.keyed import KeyedWorkers
from roles.controller.operationsets import reconcile_operation_set, report_undecodable
from roles.controller.watches import Watch, follow
from roles.kube import ApiError, Conflict, Deleted, Invalid, Kube, NotFound, Relisted, Upserted, WatchEvent
from roles.kube.errors import too_large
from roles.kube.following import mirror_by_name
from roles.kube.resources import DIAGNOSES, NODES, OPERATION_SETS, OPERATIONS, PODS, TASKS
from roles.kube.versions import revision
from schemas.core import Node, Pod
from schemas.diagnosis.v1 import (
    API_VERSION,
    DEFAULT_MAX_TARGETS,
    Diagnosis,
    DiagnosisPhase,
    Operation,
    OperationSet,
    Targets,
    Task,
    TaskPhase,
)
from schemas.meta import ObjectMeta

__all__ = ["DiagnosisController"]

Log = structlog.typing.FilteringBoundLogger
Key = tuple[str, str]
"""(namespace, name) of a Diagnosis or Task."""
COMPONENT = "nodetaskd-controller"
PROGRESS_INTERVAL_S = 2.0
"""Least seconds between two writes of a Diagnosis's status that only count more ended Tasks of a stage."""
_UNSTARTED = (DiagnosisPhase.NONE, DiagnosisPhase.PENDING)


def _version(obj: Any) -> int:
    return revision(obj.metadata.resource_version)


def _slim(node: Node) -> Node:
    """What the cache keeps of a Node: its name and labels (whether it is an edge node)."""
    return Node(metadata=ObjectMeta(name=node.metadata.name, labels=node.metadata.labels))


class DiagnosisController:
    """Runs every Diagnosis and keeps every OperationSet's status. Run it with :meth:`run` in a task group."""

    def __init__(
        self,
        *,
        kube: Kube,
        clock: Clock,
        log: Log,
        progress_interval: float = PROGRESS_INTERVAL_S,
        max_targets: int = DEFAULT_MAX_TARGETS,
    ) -> None:
        self._kube = kube
        self._progress_interval = progress_interval
        self._max_targets = max_targets
        self._nodes: dict[str, Node] = {}
        """Every Node, by name: its name and labels only (whether it exists, and is an edge node)."""
        self._clock = clock
        self._log = log.bind(controller="diagnosis")
        self._operations: dict[str, Operation] = {}
        self._operation_sets: dict[str, OperationSet] = {}
        self._undecodable_sets: dict[str, str] = {}
        self._pipelines: dict[str, tuple[str, Pipeline | BrokenGraph]] = {}
        """Per OperationSet: the resourceVersion compiled and the result (a compile can take 17 ms)."""
        self._diagnoses: dict[Key, Diagnosis] = {}
        self._tasks: dict[Key, Task] = {}
        self._owned: dict[Key, set[Key]] = {}
        """Tasks by their Diagnosis's (namespace, name)."""
        self._created: dict[Key, set[str]] = {}
        """Per Diagnosis, Tasks created (or found to exist) that the watch has not shown yet: not asked for twice."""
        self._released: set[Key] = set()
        self._status_written: dict[Key, float] = {}
        """Per Diagnosis, the loop time of this controller's last write of its status."""
        self.progress_held = 0
        """Passes that held back a status only counting more ended Tasks (a metric)."""
        self.sets_awaited = 0
        """Passes that left a new Diagnosis waiting for its OperationSet to appear (a metric)."""
        self._reported: set[str] = set()
        self._ready = anyio.Event()
        self._runs: KeyedWorkers[Key]
        self._sets: KeyedWorkers[str]

    @property
    def diagnoses(self) -> Mapping[Key, Diagnosis]:
        """A read-only view of the Diagnosis cache, keyed by (namespace, name)."""
        return MappingProxyType(self._diagnoses)

    # ------------------------------------------------------------------------------------------ watching

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch and act until cancelled; ready once every watch's first list has been taken in."""
        async with anyio.create_task_group() as tg:
            self._runs = KeyedWorkers(tg, self._diagnosis_pass, ready=self._ready, log=self._log, what="diagnosis")
            self._sets = KeyedWorkers(tg, self._set_pass, ready=self._ready, log=self._log, what="operationset")
            watches = (
                Watch(NODES, self._on_node),
                Watch(OPERATIONS, self._on_operation),
                Watch(OPERATION_SETS, self._on_operation_set),
                Watch(TASKS, self._on_task),
                Watch(DIAGNOSES, self._on_diagnosis),
            )
            await follow(tg, self._kube, watches, on_invalid=self._report_invalid)
            self._ready.set()
            task_status.started()

    def _on_node(self, event: WatchEvent) -> None:
        match event:
            case Relisted(objects=objects):
                self._nodes = {n.metadata.name: _slim(n) for n in objects}
            case Upserted(obj=node):
                self._nodes[node.metadata.name] = _slim(node)
            case Deleted(obj=node):
                self._nodes.pop(node.metadata.name, None)

    def _on_operation(self, event: WatchEvent) -> None:
        if mirror_by_name(self._operations, event):
            self._poke_running(lambda d: True)

    def _on_operation_set(self, event: WatchEvent) -> None:
        match event:
            case Relisted(objects=objects, invalid=invalid):
                self._operation_sets = {s.metadata.name: s for s in objects}
                self._undecodable_sets = {i.name: i.error for i in invalid}
                changed = None
            case Upserted(obj=operation_set):
                self._operation_sets[operation_set.metadata.name] = operation_set
                self._undecodable_sets.pop(operation_set.metadata.name, None)
                changed = operation_set.metadata.name
            case Deleted(obj=operation_set):
                self._operation_sets.pop(operation_set.metadata.name, None)
                changed = operation_set.metadata.name
            case Invalid(name=name, error=error):
                self._operation_sets.pop(name, None)
                self._undecodable_sets[name] = error
                changed = name
            case _:
                return
        for name in self._operation_sets if changed is None else (changed,):
            if name in self._operation_sets:
                self._sets.poke(name)
        self._poke_running(lambda d: changed is None or d.spec.operation_set == changed)

    def _on_task(self, event: WatchEvent) -> None:
        match event:
            case Relisted(objects=objects):
                before = set(self._owned)
                self._tasks, self._owned = {}, {}
                self._released &= {(t.metadata.namespace, t.metadata.name) for t in objects}
                for task in objects:
                    self._store_task(task)
                for owner in before | set(self._owned):
                    self._runs.poke(owner)
            case Upserted(obj=task):
                stored = self._store_task(task)
                if stored is not None:
                    self._created.get(stored, set()).discard(task.metadata.name)
                    self._runs.poke(stored)
            case Deleted(obj=task):
                key = (task.metadata.namespace, task.metadata.name)
                self._tasks.pop(key, None)
                self._released.discard(key)
                ref = owner_of(task)
                if ref is not None:
                    owner = (task.metadata.namespace, ref.name)
                    self._owned.get(owner, set()).discard(key)
                    self._runs.poke(owner)

    def _store_task(self, task: Task, *, only_newer: bool = False) -> Key | None:
        """Cache ``task`` under its Diagnosis; returns the Diagnosis's key (None for a Task nobody owns)."""
        ref = owner_of(task)
        if ref is None:
            return None
        key = (task.metadata.namespace, task.metadata.name)
        cached = self._tasks.get(key)
        if only_newer and cached is not None and _version(cached) > _version(task):
            return None
        self._tasks[key] = task
        owner = (task.metadata.namespace, ref.name)
        self._owned.setdefault(owner, set()).add(key)
        return owner

    def _on_diagnosis(self, event: WatchEvent) -> None:
        match event:
            case Relisted(objects=objects):
                gone = set(self._diagnoses)
                self._diagnoses = {(d.metadata.namespace, d.metadata.name): d for d in objects}
                for key in gone | set(self._diagnoses) | set(self._owned):
                    self._runs.poke(key)
            case Upserted(obj=diagnosis) | Deleted(obj=diagnosis):
                key = (diagnosis.metadata.namespace, diagnosis.metadata.name)
                if isinstance(event, Deleted):
                    self._diagnoses.pop(key, None)
                else:
                    self._diagnoses[key] = diagnosis
                self._runs.poke(key)

    def _poke_running(self, wanted: Callable[[Diagnosis], bool]) -> None:
        for key, diagnosis in self._diagnoses.items():
            if diagnosis.status.phase not in (DiagnosisPhase.SUCCEEDED, DiagnosisPhase.FAILED) and wanted(diagnosis):
                self._runs.poke(key)

    async def _report_invalid(self, kind: str, bad: Invalid) -> None:
        """A Diagnosis or OperationSet that does not decode gets a status saying why, once per object."""
        if bad.uid in self._reported or kind not in ("diagnoses", "operationsets"):
            return
        now = self._clock.now()
        if kind == "operationsets":
            await report_undecodable(self._kube, bad.name, bad.error, now=now, log=self._log)
        else:
            condition = {"type": "Complete", "status": "False", "reason": "Invalid", "message": bad.error}
            condition["lastTransitionTime"] = format_time(now)
            patch = {"status": {"phase": DiagnosisPhase.FAILED.value, "conditions": [condition]}}
            try:
                await self._kube.merge_patch_raw(
                    DIAGNOSES, bad.name, patch, namespace=bad.namespace, subresource="status"
                )
            except ApiError as exc:
                self._log.warning("invalid_diagnosis_not_reported", diagnosis=bad.name, error=str(exc))
                return
            self._log.warning("invalid_diagnosis", diagnosis=bad.name, namespace=bad.namespace, error=bad.error)
        self._reported.add(bad.uid)

    # ------------------------------------------------------------------------------------------ passes

    async def _set_pass(self, name: str) -> float | None:
        operation_set = self._operation_sets.get(name)
        if operation_set is not None:
            await reconcile_operation_set(self._kube, operation_set, now=self._clock.now(), log=self._log)
        return None

    async def _diagnosis_pass(self, key: Key) -> float | None:
        diagnosis = self._diagnoses.get(key)
        live = diagnosis is not None and diagnosis.metadata.deletion_timestamp is None
        await self._release_tasks(key, keep=diagnosis.metadata.uid if diagnosis is not None and live else None)
        if diagnosis is None or not live:
            self._created.pop(key, None)
            self._status_written.pop(key, None)
            return None  # each released Task's Deleted event pokes this key again
        log = self._log.bind(diagnosis=f"{key[0]}/{key[1]}")
        now = self._clock.now()
        if diagnosis.status.phase in _UNSTARTED:
            awaited = awaiting_operation_set(diagnosis, self._world(diagnosis, now))
            if awaited is not None:
                self.sets_awaited += 1
                # The OperationSet's event passes again at once; this is the fallback to fail it.
                log.info(
                    "operation_set_awaited", operation_set=diagnosis.spec.operation_set, until=format_time(awaited)
                )
                return self._clock.loop_time(awaited)
            started = await self._start(diagnosis, now, log)
            if started is None:
                return None  # changed meanwhile: the newer copy's event passes again
            diagnosis = started
        return await self._advance(diagnosis, now, log)

    def _world(self, diagnosis: Diagnosis, now: datetime) -> World:
        meta = diagnosis.metadata
        tasks: dict[str, Task] = {}
        for key in self._owned.get((meta.namespace, meta.name), ()):
            task = self._tasks[key]
            ref = owner_of(task)
            if ref is not None and ref.uid == meta.uid:
                tasks[key[1]] = task
        return World(
            pipeline=self._pipeline(diagnosis.spec.operation_set),
            operations=MappingProxyType(self._operations),
            tasks=MappingProxyType(tasks),
            now=now,
        )

    def _pipeline(self, name: str) -> Pipeline | BrokenGraph | None:
        operation_set = self._operation_sets.get(name)
        if operation_set is None:
            error = self._undecodable_sets.get(name)
            return None if error is None else BrokenGraph("", (f"spec does not decode: {error}",))
        version = operation_set.metadata.resource_version
        cached = self._pipelines.get(name)
        if cached is not None and cached[0] == version:
            return cached[1]
        pipeline = pipeline_of(operation_set)
        self._pipelines[name] = (version, pipeline)
        return pipeline

    async def _start(self, diagnosis: Diagnosis, now: datetime, log: Log) -> Diagnosis | None:
        """Resolve the targets and write the run's start: hash and pods first, then the status."""
        world = self._world(diagnosis, now)
        # start() fails a run it cannot start before looking at its targets: nothing to read for it.
        runnable = isinstance(world.pipeline, Pipeline) and parameters_problem(diagnosis) is None
        resolution = await self._resolve(diagnosis) if runnable else Resolution(())
        step = start(diagnosis, world, resolution)
        meta = diagnosis.metadata
        labels = {k: v for k, v in step.labels.items() if meta.labels.get(k) != v}
        pods = step.annotations.get(PODS_ANNOTATION)
        if labels or meta.annotations.get(PODS_ANNOTATION) != pods:
            patch = {
                "metadata": {
                    "labels": labels,
                    "annotations": {PODS_ANNOTATION: pods},
                    "resourceVersion": meta.resource_version,
                }
            }
            try:
                diagnosis = await self._kube.merge_patch(DIAGNOSES, meta.name, patch, namespace=meta.namespace)
            except Conflict:
                return None
            except ApiError as exc:
                if not too_large(exc):
                    raise
                await self._fail_too_large(diagnosis, exc, now, log)
                return None
        decided: list[Step] = []

        def mutate(fresh: Diagnosis) -> Diagnosis | None:
            decided.clear()
            labelled = all(fresh.metadata.labels.get(k) == v for k, v in step.labels.items())
            if fresh.status.phase not in _UNSTARTED or not labelled:
                return None
            decided.append(start(fresh, self._world(fresh, now), resolution))
            return msgspec.structs.replace(fresh, status=decided[0].status)

        written = await self._write_status(diagnosis, mutate, now, log)
        if written is None or not decided:
            return None
        self._status_written[(meta.namespace, meta.name)] = anyio.current_time()
        log.info("diagnosis_started", phase=written.status.phase, nodes=len(written.status.node_names))
        await self._tell(written, decided[0].notices, now, log)
        return written

    async def _resolve(self, diagnosis: Diagnosis) -> Resolution:
        """Read what the Diagnosis's one kind of target needs, and resolve it.

        Nothing is read for a Diagnosis listing more targets than it may have; only pods of its own
        namespace are read, and only Nodes the watch has not shown (made-up names cost a 404 each).
        """
        namespace = diagnosis.metadata.namespace
        selector = diagnosis.spec.target_selector
        targets = selector.targets() if selector is not None else Targets()
        limit = self._max_targets
        if requested(targets) > limit:
            return resolve(targets, namespace=namespace, max_targets=limit)
        nodes: list[Node] = []
        pods: list[Pod] = []
        # The same precedence as resolve(): only the first kind of target set is read.
        if targets.node_selector is not None:
            nodes, _, _ = await self._kube.list(NODES, label_selector=targets.node_selector.to_query())
        elif targets.node_names:
            nodes = await self._existing(n for n in targets.node_names if is_object_name(n))
        elif targets.pod_selector is not None:
            query = targets.pod_selector.to_query()
            pods, _, _ = await self._kube.list(PODS, label_selector=query, namespace=namespace)
            nodes = await self._existing(p.spec.node_name for p in pods if is_object_name(p.spec.node_name))
        else:
            for ref in readable(targets, namespace=namespace):
                try:
                    pods.append(await self._kube.get(PODS, ref.name, namespace=ref.namespace))
                except NotFound:
                    continue
            nodes = await self._existing(p.spec.node_name for p in pods if is_object_name(p.spec.node_name))
        return resolve(targets, namespace=namespace, nodes=nodes, pods=pods, max_targets=limit)

    async def _existing(self, names: Iterable[str]) -> list[Node]:
        """The Nodes among ``names`` that exist: from the watch's cache, or read when it has not shown them
        (a Node created just before the Diagnosis may reach this controller after it)."""
        found: list[Node] = []
        missing: list[str] = []
        for name in dict.fromkeys(names):
            node = self._nodes.get(name)
            if node is None:
                missing.append(name)
            else:
                found.append(node)

        async def read(name: str) -> None:
            with contextlib.suppress(NotFound):
                found.append(_slim(await self._kube.get(NODES, name)))

        # The client caps the requests in flight.
        async with anyio.create_task_group() as tg:
            for name in missing:
                tg.start_soon(read, name)
        return found

    async def _advance(self, diagnosis: Diagnosis, now: datetime, log: Log) -> float | None:
        meta = diagnosis.metadata
        key = (meta.namespace, meta.name)
        step = advance(diagnosis, self._world(diagnosis, now))
        if step.expire:
            await self._expire(diagnosis, step.expire, now, log)
            step = advance(diagnosis, self._world(diagnosis, now))
        held = self._held(key, diagnosis, step)
        if step.status != diagnosis.status and held is None:
            decided: list[Step] = []

            def mutate(fresh: Diagnosis) -> Diagnosis | None:
                decided.clear()
                fresh_step = advance(fresh, self._world(fresh, now))
                if fresh_step.status == fresh.status:
                    return None
                decided.append(fresh_step)
                return msgspec.structs.replace(fresh, status=fresh_step.status)

            written = await self._write_status(diagnosis, mutate, now, log)
            if written is None:
                return None
            if decided:
                self._status_written[key] = anyio.current_time()
                cp = written.status.checkpoint
                log.info(
                    "diagnosis_status",
                    phase=written.status.phase,
                    path=cp.path_index if cp else None,
                    stage=cp.node_index if cp else None,
                    succeeded=cp.succeeded if cp else None,
                    failed=cp.failed if cp else None,
                )
                await self._tell(written, decided[0].notices, now, log)
            diagnosis = written
            step = advance(diagnosis, self._world(diagnosis, now))
        if step.delete:
            with contextlib.suppress(NotFound):
                await self._kube.delete(DIAGNOSES, meta.name, namespace=meta.namespace)
            log.info("diagnosis_reaped", ttl_s=diagnosis.spec.ttl_seconds_after_finished)
            return None
        await self._create(diagnosis, step.create)
        # No deadline: nothing happens until something changes, whose event starts a worker again.
        due = None if step.due is None else self._clock.loop_time(step.due)
        return held if due is None or (held is not None and held < due) else due

    async def _write_status(
        self, diagnosis: Diagnosis, mutate: Callable[[Diagnosis], Diagnosis | None], now: datetime, log: Log
    ) -> Diagnosis | None:
        """The status ``mutate`` makes, written; None when nothing was written, or when the API server refused
        it as too large (the Diagnosis is then failed saying so)."""
        meta = diagnosis.metadata
        try:
            return await self._kube.update_status(
                DIAGNOSES, meta.name, mutate, namespace=meta.namespace, current=diagnosis
            )
        except ApiError as exc:
            if not too_large(exc):
                raise
            await self._fail_too_large(diagnosis, exc, now, log)
            return None

    async def _fail_too_large(self, diagnosis: Diagnosis, error: ApiError, now: datetime, log: Log) -> None:
        """The API server refused the Diagnosis's next status for its size: end the run Failed, saying so.

        The run's own bound (:mod:`flows.diagnosis.size`) should have kept it from this; if it did not,
        the same write would be refused again at every retry. The failed status leaves out the node
        names and results; if even that is refused, nothing more can be written, which is logged.
        """
        meta = diagnosis.metadata
        message = f"the API server refused to store its status: {error.message}"
        decided: list[Step] = []

        def mutate(fresh: Diagnosis) -> Diagnosis | None:
            decided.clear()
            if fresh.status.phase in FINAL_PHASES:
                return None
            decided.append(fail_too_large(fresh, message, now=now))
            return msgspec.structs.replace(fresh, status=decided[0].status)

        log.error("diagnosis_status_too_large", error=str(error))
        try:
            written = await self._kube.update_status(
                DIAGNOSES, meta.name, mutate, namespace=meta.namespace, current=diagnosis
            )
        except ApiError as exc:
            if not too_large(exc):
                raise
            log.error("diagnosis_failure_too_large", error=str(exc))
            return
        if written is not None and decided:
            self._status_written[(meta.namespace, meta.name)] = anyio.current_time()
            await self._tell(written, decided[0].notices, now, log)

    def _held(self, key: Key, diagnosis: Diagnosis, step: Step) -> float | None:
        """Until when the status ``step`` decided is held back (None: write it now).

        A status that only counts more ended Tasks of the running stage waits until ``progress_interval``
        after the last write, so a stage of a thousand Tasks ending one by one costs a few writes, not a
        thousand; anything else (a stage decided, the run ended, a condition set) is written at once.
        """
        if step.status == diagnosis.status or not progress_only(diagnosis.status, step):
            return None
        last = self._status_written.get(key)
        if last is None or anyio.current_time() >= last + self._progress_interval:
            return None
        self.progress_held += 1
        return last + self._progress_interval

    async def _expire(self, diagnosis: Diagnosis, names: Iterable[str], now: datetime, log: Log) -> None:
        """Declare Unknown each named Task still without a result past its deadline (checked on a fresh copy)."""
        namespace = diagnosis.metadata.namespace
        for name in names:
            task = self._tasks.get((namespace, name))
            operation = self._operations.get(task.spec.operation) if task is not None else None
            if task is None or operation is None:
                continue
            timeout = operation.spec.processor.timeout_seconds
            try:
                fresh = await self._kube.update_status(
                    TASKS,
                    name,
                    functools.partial(timed_out, timeout_seconds=timeout, now=now),
                    namespace=namespace,
                    current=task,
                )
            except NotFound:
                continue
            if fresh is None:
                continue
            self._store_task(fresh, only_newer=True)
            if fresh.status.phase is TaskPhase.UNKNOWN and task.status.phase is not TaskPhase.UNKNOWN:
                log.info("task_timed_out", task=name, node=task.spec.node_name, timeout_s=timeout)
                message = f"Task {name} on node {task.spec.node_name}: no result within {timeout} s"
                await self._tell(diagnosis, (Notice("Warning", "TaskTimedOut", message),), now, log)

    async def _create(self, diagnosis: Diagnosis, tasks: Iterable[Task]) -> None:
        """Create the Tasks not already asked for; one that exists already is as good as created."""
        key = (diagnosis.metadata.namespace, diagnosis.metadata.name)
        asked = self._created.setdefault(key, set())
        todo = [t for t in tasks if t.metadata.name not in asked]
        errors: list[ApiError] = []

        async def create(task: Task) -> None:
            try:
                await self._kube.create(TASKS, task, namespace=task.metadata.namespace)
            except Conflict:
                pass  # it exists: a name is a stage on a node, so it is this very Task
            except ApiError as exc:
                errors.append(exc)
                return
            asked.add(task.metadata.name)

        # The client caps the requests in flight; a stage over many nodes creates its Tasks at that pace.
        async with anyio.create_task_group() as tg:
            for task in todo:
                tg.start_soon(create, task)
        if errors:
            raise errors[0]

    async def _release_tasks(self, key: Key, *, keep: str | None) -> None:
        """Take the finalizer off, and delete, every Task of ``key`` not owned by the live Diagnosis ``keep``."""
        todo: list[tuple[Key, Task]] = []
        for task_key in self._owned.get(key, ()):
            task = self._tasks[task_key]
            ref = owner_of(task)
            if task_key not in self._released and ref is not None and ref.uid != keep:
                todo.append((task_key, task))
        errors: list[ApiError] = []

        async def release(task_key: Key, task: Task) -> None:
            meta = task.metadata
            try:
                if TASK_FINALIZER in meta.finalizers:
                    rest = [f for f in meta.finalizers if f != TASK_FINALIZER]
                    patch = {"metadata": {"finalizers": rest, "resourceVersion": meta.resource_version}}
                    await self._kube.merge_patch(TASKS, meta.name, patch, namespace=meta.namespace)
                if meta.deletion_timestamp is None:
                    await self._kube.delete(TASKS, meta.name, namespace=meta.namespace)
            except NotFound:
                pass
            except ApiError as exc:
                errors.append(exc)
                return
            self._released.add(task_key)
            self._log.info("task_released", diagnosis=f"{key[0]}/{key[1]}", task=meta.name)

        # All at once: the client caps the requests in flight, and a 1,000-node run has thousands of Tasks.
        async with anyio.create_task_group() as tg:
            for task_key, task in todo:
                tg.start_soon(release, task_key, task)
        if errors:
            raise errors[0]

    async def _tell(self, diagnosis: Diagnosis, notices: Iterable[Notice], now: datetime, log: Log) -> None:
        """Record the notices as Events on the Diagnosis; a failed Event write is logged, never fatal."""
        for notice in notices:
            event = object_event(
                api_version=API_VERSION,
                kind="Diagnosis",
                meta=diagnosis.metadata,
                reason=notice.reason,
                message=notice.message,
                type_=notice.type,
                component=COMPONENT,
                now=format_time(now),
            )
            await record_event(self._kube, event, log)
