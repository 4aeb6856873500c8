"""The diagnosis controller's I/O shell: watch the five kinds, one serial worker per object, write decisions.

Nodes, Operations, OperationSets, Diagnoses and Tasks are watched into caches
(:mod:`roles.controller.diagnosis.caches`; a Diagnosis's Tasks are for existing edge Nodes only, whose
reading is :mod:`roles.controller.diagnosis.targets`).
A Diagnosis's worker passes when the Diagnosis, one of its Tasks, its OperationSet or any Operation
changes, or when its next deadline comes (a Task's timeout, its TTL); each pass asks
:mod:`flows.diagnosis.run` what to do and does it, in an order that a crash at any point leaves
resumable: metadata (the graph's hash, the pods), then the status (written conditionally, re-decided
on a fresh copy after a conflict), then the Tasks the written status asks for. The controller is the
only writer of a Diagnosis's status; the hubs write Tasks' status, and the controller writes a
Task's only to declare it Unknown, on a fresh copy that has no result yet.

Deletion: a Task keeps its finalizer while its Diagnosis exists. Once the Diagnosis is gone (or
being deleted), its worker takes the finalizer off each Task and deletes it
(:mod:`roles.controller.diagnosis.tasks`), so deleting a Diagnosis removes its Tasks with or without
the garbage collector; Tasks whose Diagnosis went away while no controller ran are found at the
first list.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from types import MappingProxyType

import anyio
import anyio.abc
import msgspec
import structlog

from flows.diagnosis.pipeline import Pipeline
from flows.diagnosis.run import (
    advance,
    awaiting_operation_set,
    fail_too_large,
    parameters_problem,
    progress_only,
    start,
)
from flows.diagnosis.stages import PODS_ANNOTATION
from flows.diagnosis.step import FINAL_PHASES, Notice, Step
from flows.diagnosis.targets import Resolution
from flows.diagnosis.tasks import timed_out
from nodetask.clock import Clock, format_time
from roles.common.events import object_event, record_event
from roles.controller.diagnosis.caches import DiagnosisCaches, Key, Pokes
from roles.controller.diagnosis.operationsets import reconcile_operation_set, report_undecodable
from roles.controller.diagnosis.targets import read_targets
from roles.controller.diagnosis.tasks import create_tasks, release_tasks
from roles.controller.keyed import KeyedWorkers
from roles.controller.watches import Watch, follow
from roles.kube import ApiError, Conflict, Invalid, Kube, NotFound, WatchEvent
from roles.kube.errors import too_large
from roles.kube.resources import DIAGNOSES, NODES, OPERATION_SETS, OPERATIONS, TASKS
from schemas.diagnosis.v1 import API_VERSION, DEFAULT_MAX_TARGETS, Diagnosis, DiagnosisPhase, TaskPhase

__all__ = ["DiagnosisController"]

Log = structlog.typing.FilteringBoundLogger
COMPONENT = "nodetaskd-controller"
PROGRESS_INTERVAL_S = 2.0
"""Least seconds between two writes of a Diagnosis's status that only count more ended Tasks of a stage."""
_UNSTARTED = (DiagnosisPhase.NONE, DiagnosisPhase.PENDING)


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
        self._clock = clock
        self._log = log.bind(controller="diagnosis")
        self._caches = DiagnosisCaches()
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
        return MappingProxyType(self._caches.diagnoses)

    # ------------------------------------------------------------------------------------------ watching

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch and act until cancelled; ready once every watch's first list has been taken in."""
        async with anyio.create_task_group() as tg:
            self._runs = KeyedWorkers(tg, self._diagnosis_pass, ready=self._ready, log=self._log, what="diagnosis")
            self._sets = KeyedWorkers(tg, self._set_pass, ready=self._ready, log=self._log, what="operationset")
            watches = (
                Watch(NODES, self._poking(self._caches.on_node)),
                Watch(OPERATIONS, self._poking(self._caches.on_operation)),
                Watch(OPERATION_SETS, self._poking(self._caches.on_operation_set)),
                Watch(TASKS, self._poking(self._caches.on_task)),
                Watch(DIAGNOSES, self._poking(self._caches.on_diagnosis)),
            )
            await follow(tg, self._kube, watches, on_invalid=self._report_invalid)
            self._ready.set()
            task_status.started()

    def _poking(self, handle: Callable[[WatchEvent], Pokes]) -> Callable[[WatchEvent], None]:
        """``handle``, poking the workers its answer names."""

        def handle_and_poke(event: WatchEvent) -> None:
            pokes = handle(event)
            for name in pokes.sets:
                self._sets.poke(name)
            for key in pokes.runs:
                self._runs.poke(key)

        return handle_and_poke

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
        operation_set = self._caches.operation_sets.get(name)
        if operation_set is not None:
            await reconcile_operation_set(self._kube, operation_set, now=self._clock.now(), log=self._log)
        return None

    async def _diagnosis_pass(self, key: Key) -> float | None:
        diagnosis = self._caches.diagnoses.get(key)
        live = diagnosis is not None and diagnosis.metadata.deletion_timestamp is None
        keep = diagnosis.metadata.uid if diagnosis is not None and live else None
        await release_tasks(self._kube, self._caches, key, keep=keep, log=self._log)
        if diagnosis is None or not live:
            self._caches.created.pop(key, None)
            self._status_written.pop(key, None)
            return None  # each released Task's Deleted event pokes this key again
        log = self._log.bind(diagnosis=f"{key[0]}/{key[1]}")
        now = self._clock.now()
        if diagnosis.status.phase in _UNSTARTED:
            awaited = awaiting_operation_set(diagnosis, self._caches.world(diagnosis, now))
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

    async def _start(self, diagnosis: Diagnosis, now: datetime, log: Log) -> Diagnosis | None:
        """Resolve the targets and write the run's start: hash and pods first, then the status."""
        world = self._caches.world(diagnosis, now)
        # start() fails a run it cannot start before looking at its targets: nothing to read for it.
        runnable = isinstance(world.pipeline, Pipeline) and parameters_problem(diagnosis) is None
        resolution = (
            await read_targets(self._kube, diagnosis, nodes=self._caches.nodes, max_targets=self._max_targets)
            if runnable
            else Resolution(())
        )
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
            decided.append(start(fresh, self._caches.world(fresh, now), resolution))
            return msgspec.structs.replace(fresh, status=decided[0].status)

        written = await self._write_status(diagnosis, mutate, now, log)
        if written is None or not decided:
            return None
        self._status_written[(meta.namespace, meta.name)] = anyio.current_time()
        log.info("diagnosis_started", phase=written.status.phase, nodes=len(written.status.node_names))
        await self._tell(written, decided[0].notices, now, log)
        return written

    async def _advance(self, diagnosis: Diagnosis, now: datetime, log: Log) -> float | None:
        meta = diagnosis.metadata
        key = (meta.namespace, meta.name)
        step = advance(diagnosis, self._caches.world(diagnosis, now))
        if step.expire:
            await self._expire(diagnosis, step.expire, now, log)
            step = advance(diagnosis, self._caches.world(diagnosis, now))
        held = self._held(key, diagnosis, step)
        if step.status != diagnosis.status and held is None:
            decided: list[Step] = []

            def mutate(fresh: Diagnosis) -> Diagnosis | None:
                decided.clear()
                fresh_step = advance(fresh, self._caches.world(fresh, now))
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
            step = advance(diagnosis, self._caches.world(diagnosis, now))
        if step.delete:
            with contextlib.suppress(NotFound):
                await self._kube.delete(DIAGNOSES, meta.name, namespace=meta.namespace)
            log.info("diagnosis_reaped", ttl_s=diagnosis.spec.ttl_seconds_after_finished)
            return None
        asked = self._caches.created.setdefault(key, set())
        await create_tasks(self._kube, step.create, asked=asked)
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
            task = self._caches.tasks.get((namespace, name))
            operation = self._caches.operations.get(task.spec.operation) if task is not None else None
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
            self._caches.store_task(fresh, only_newer=True)
            if fresh.status.phase is TaskPhase.UNKNOWN and task.status.phase is not TaskPhase.UNKNOWN:
                log.info("task_timed_out", task=name, node=task.spec.node_name, timeout_s=timeout)
                message = f"Task {name} on node {task.spec.node_name}: no result within {timeout} s"
                await self._tell(diagnosis, (Notice("Warning", "TaskTimedOut", message),), now, log)

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
