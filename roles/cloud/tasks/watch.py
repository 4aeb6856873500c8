"""The hub's diagnosis Tasks: each sent to its node while the node is connected here, its status written from
what the node says.

KubeDiag's Task runs as a job type of the node-task protocol (:mod:`flows.diagnosis.job`): route
``diagnosis.kubediag.org/v1/task/<task>/nodes/<node>``, the Task's uid as job UID, one action. A
Task is namespaced and a route has no room for a namespace, so the hub keeps its Tasks by uid, the
job UID every report carries; the RunAction's spec names the namespace for the edge.

Tasks (all namespaces) and Operations are watched. Every Task that has not ended, is not being
deleted and names a node connected here gets a worker (:meth:`Tasks._work`), with no concurrency
limit (the controller creates one stage at a time). The worker reads the Task's Operation and its
Diagnosis's parameters (:mod:`roles.cloud.tasks.parameters`: a Task does not carry them), sends
the RunAction on every session of the node until the Task ends (the edge stores a Task once by its
uid and only acknowledges a repeat), writes ``startTime`` after the first send and Running with
Accepted when the node acknowledges it. A Task whose Operation does not exist fails with
OperationNotFound naming it, one whose Diagnosis is gone with DiagnosisNotFound. A Task deleted,
or declared Unknown by the controller, while its node holds it gets a Cancel.

Reports come through the edge's outbox and are answered only once written (:meth:`Tasks.answer`),
through one coalescing status writer per Task that has not ended (:mod:`~roles.cloud.tasks.status_writes`,
which makes every status write here). No write moves a Task out of a
final phase; a result arriving after the controller's Unknown is acknowledged and dropped.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from typing import Final

import anyio
import anyio.abc
import msgspec
import structlog

from flows.diagnosis import hub_task
from flows.diagnosis import job as diagnosis_job
from flows.diagnosis.hub_task import Recorded, accepted, failed, route_of, sent
from flows.diagnosis.job import RUN
from flows.diagnosis.tasks import owner_of
from nodetask.clock import Clock
from nodetask.messages import Cancel, Error, Report, ReportAck, RunAction
from roles.cloud.api import TaskApi
from roles.cloud.jobs.reports import JOB_GONE, REPORT_REJECTED
from roles.cloud.sessions import SessionTable
from roles.cloud.settings import HubSettings
from roles.cloud.tasks.parameters import ParameterReader
from roles.cloud.tasks.state import TaskState, is_fresher, kept
from roles.cloud.tasks.status_writes import TaskStatusWrites
from roles.kube import ApiError, Deleted, Relisted, Upserted, WatchEvent
from roles.kube.following import follow, mirror_by_name
from roles.kube.resources import OPERATIONS, TASKS
from roles.kube.retrying import Outage, read_through_outage
from schemas.diagnosis import v1 as diagnosis
from schemas.diagnosis.v1 import Operation, Task, TaskPhase

__all__ = ["Tasks"]

Log = structlog.typing.FilteringBoundLogger

CANCEL_GRACE_S: Final = 2.0
GONE_KEPT: Final = 4096
"""Uids of deleted Tasks remembered, so that their late reports are answered without asking the API server."""


class Tasks:
    """Every Task this hub may send to a node. Run :meth:`run`; ready once both watches have listed."""

    def __init__(self, api: TaskApi, *, sessions: SessionTable, clock: Clock, settings: HubSettings, log: Log) -> None:
        self._api = api
        self._sessions = sessions
        self._clock = clock
        self._settings = settings
        self._log = log
        self._by_uid: dict[str, TaskState] = {}
        self._open_by_node: dict[str, set[str]] = {}
        self._operations: dict[str, Operation] = {}
        self._gone: OrderedDict[str, None] = OrderedDict()
        self._parameters = ParameterReader(api, log=log)
        self._writes = TaskStatusWrites(api, settings=settings, clock=clock, log=log, on_written=self._upsert)
        self._tg: anyio.abc.TaskGroup | None = None
        self.synced = anyio.Event()
        """Set once the first lists of Tasks and Operations are taken in."""

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Follow Tasks and Operations, sending and writing as they need, until cancelled."""
        async with anyio.create_task_group() as tg:
            self._tg = self._writes.tg = tg
            await follow(tg, functools.partial(self._api.watch, OPERATIONS), self._on_operation)
            await follow(tg, functools.partial(self._api.watch, TASKS), self._on_task)
            self.synced.set()
            task_status.started()

    def offer(self, node: str) -> None:
        """A session of ``node`` came up: each of its open Tasks gets a worker if it has none."""
        for uid in sorted(self._open_by_node.get(node, ())):
            self._start(self._by_uid[uid])

    # ---------------------------------------------------------------------------------------- the watches

    def _on_operation(self, event: WatchEvent) -> None:
        mirror_by_name(self._operations, event)

    def _on_task(self, event: WatchEvent) -> None:
        match event:
            case Relisted(objects=objects):
                listed = {task.metadata.uid for task in objects}
                for uid in [uid for uid in self._by_uid if uid not in listed]:
                    self._forget(uid)
                for task in objects:
                    self._upsert(task)
            case Upserted(obj=task):
                self._upsert(task)
            case Deleted(obj=task):
                self._forget(task.metadata.uid)
            case _:
                pass

    def _upsert(self, task: Task) -> None:
        uid = task.metadata.uid
        state = self._by_uid.get(uid)
        if state is None:
            state = self._by_uid[uid] = TaskState(task=kept(task))
        elif is_fresher(task, state.task):
            state.update(kept(task))
        else:
            return
        self._index(state)
        if state.open:
            self._start(state)
        elif state.final and state.writer is not None:
            state.writer.close()  # what it holds is written (each a no-op now); nothing more comes
            state.writer = None

    def _forget(self, uid: str) -> None:
        state = self._by_uid.pop(uid, None)
        if state is None:
            return
        state.gone = True
        state.changed.set()
        self._index(state)
        if state.writer is not None:
            state.writer.close()
            state.writer = None
        self._gone[uid] = None
        while len(self._gone) > GONE_KEPT:
            self._gone.popitem(last=False)

    def _index(self, state: TaskState) -> None:
        uid = state.task.metadata.uid
        node = state.task.spec.node_name if state.open else ""
        if node == state.node:
            return
        if state.node:
            waiting = self._open_by_node.get(state.node, set())
            waiting.discard(uid)
            if not waiting:
                self._open_by_node.pop(state.node, None)
        if node:
            self._open_by_node.setdefault(node, set()).add(uid)
        state.node = node

    # ---------------------------------------------------------------------------------------- sending

    def _start(self, state: TaskState) -> None:
        node = state.task.spec.node_name
        if state.worker is not None or not state.open or node not in self._sessions or self._tg is None:
            return
        scope = state.worker = anyio.CancelScope()
        self._tg.start_soon(self._work, state, scope)

    async def _work(self, state: TaskState, scope: anyio.CancelScope) -> None:
        """Send the Task to its node on every session until it ends; Cancel it there if it is deleted first."""
        task = state.task
        meta, node = task.metadata, task.spec.node_name
        log = self._log.bind(task=f"{meta.namespace}/{meta.name}", node=node, uid=meta.uid)
        was_sent = False
        try:
            with scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._until_closed, state, tg.cancel_scope)
                    spec = await self._spec(state, log)
                    if spec is None:
                        tg.cancel_scope.cancel()
                        return
                    route = route_of(task)
                    sends = 0
                    while True:
                        session = await self._sessions.wait_for(node)
                        sends += 1
                        msg = RunAction(id=f"{meta.uid}/{sends}", route=route, job_uid=meta.uid, action=RUN, spec=spec)
                        acked = session.expect_ack(msg.id)
                        if not await session.send(msg):
                            continue
                        log.debug("task_sent", attempt=sends)
                        if not was_sent:
                            was_sent = True
                            tg.start_soon(
                                self._writes.write_retrying, state, sent(uid=meta.uid, now=self._clock.now()), log
                            )
                        async with anyio.create_task_group() as this_session:
                            this_session.start_soon(self._accept_when_acked, state, acked, tg, log)
                            await session.closed.wait()
                            this_session.cancel_scope.cancel()
        finally:
            if state.worker is scope:
                state.worker = None
            with anyio.CancelScope(shield=True):
                await self._cancel_if_abandoned(state, node, was_sent, log)

    async def _until_closed(self, state: TaskState, scope: anyio.CancelScope) -> None:
        while state.open:
            await state.changed.wait()
        scope.cancel()

    async def _spec(self, state: TaskState, log: Log) -> msgspec.Raw | None:
        """The RunAction's spec, or None when the Task failed here instead (no Operation, no Diagnosis,
        request too large)."""
        task = state.task
        name, uid = task.spec.operation, task.metadata.uid
        operation = self._operations.get(name) or await self._read_operation(name, log)
        if operation is None:
            log.warning("task_operation_not_found", operation=name)
            message = f"Operation {name} is not found"
            change = failed(
                uid=uid,
                reason=hub_task.OPERATION_NOT_FOUND,
                message=message,
                condition_type=hub_task.OPERATION_NOT_FOUND,
                now=self._clock.now(),
            )
            await self._writes.write_retrying(state, change, log)
            return None
        # The Diagnosis's parameters are read from it (a Task made by hand, with no owner, has only its own).
        owner = owner_of(task)
        parameters = None
        if owner is not None:
            parameters = await self._parameters.parameters(
                namespace=task.metadata.namespace, name=owner.name, uid=owner.uid
            )
            if parameters is None:
                log.warning("task_diagnosis_not_found", diagnosis=owner.name)
                message = f"Diagnosis {owner.name} (uid {owner.uid}) is not found: its parameters cannot be read"
                change = failed(uid=uid, reason=hub_task.DIAGNOSIS_NOT_FOUND, message=message, now=self._clock.now())
                await self._writes.write_retrying(state, change, log)
                return None
        raw = hub_task.task_run(task, operation.spec.processor, parameters)
        if len(raw) > diagnosis_job.MAX_REQUEST_BYTES:
            message = (
                f"the request data is {len(raw)} bytes as JSON, more than the"
                f" {diagnosis_job.MAX_REQUEST_BYTES} a node takes in one task"
            )
            log.warning("task_request_too_large", size=len(raw))
            change = failed(uid=uid, reason=hub_task.REQUEST_TOO_LARGE, message=message, now=self._clock.now())
            await self._writes.write_retrying(state, change, log)
            return None
        return msgspec.Raw(raw)

    async def _read_operation(self, name: str, log: Log) -> Operation | None:
        """The Operation from the API server: the Task may have come through its watch before the Operation did."""
        return await read_through_outage(
            self._api, OPERATIONS, name, log=log.bind(operation=name), event="operation_read_retry"
        )

    async def _accept_when_acked(
        self, state: TaskState, acked: anyio.Event, worker: anyio.abc.TaskGroup, log: Log
    ) -> None:
        """Once this session's RunAction is acknowledged, write Accepted in the worker's scope: the Task stays
        stored on the node when the session ends, and the write must not end with it."""
        await acked.wait()
        worker.start_soon(self._write_accepted, state, log)

    async def _write_accepted(self, state: TaskState, log: Log) -> None:
        node = state.task.spec.node_name
        outcome = await self._writes.write_retrying(
            state, accepted(uid=state.task.metadata.uid, node=node, now=self._clock.now()), log
        )
        if outcome is Recorded.APPLIED:
            log.info("task_accepted")

    async def _cancel_if_abandoned(self, state: TaskState, node: str, sent: bool, log: Log) -> None:
        """Tell the node to stop a Task it holds that was deleted or declared Unknown (best effort, bounded)."""
        deleted = state.gone or state.task.metadata.deletion_timestamp is not None
        if not sent or not (deleted or state.task.status.phase is TaskPhase.UNKNOWN):
            return
        session = self._sessions.get(node)
        if session is None:
            return
        with anyio.move_on_after(CANCEL_GRACE_S):
            if await session.send(Cancel(route=route_of(state.task), job_uid=state.task.metadata.uid)):
                log.info("task_cancelled", deleted=deleted, phase=state.task.status.phase)

    # ---------------------------------------------------------------------------------------- reports

    async def answer(self, report: Report, log: Log) -> ReportAck | Error:
        """Record ``report`` (from its own node's session); the answer the edge gets once it is written."""
        ref = str(report.seq)
        log = log.bind(task=report.route.job, uid=report.job_uid, seq=report.seq)
        if report.route.api_version != diagnosis.API_VERSION:
            what = f"a {report.route.job_type} under {report.route.api_version}"
            return Error(code=REPORT_REJECTED, message=f"no diagnosis task reports {what}", ref=ref)
        if report.route.job_type != diagnosis_job.RESOURCE_TYPE or report.action != RUN:
            what = f"{report.route.job_type} action {report.action}"
            return Error(code=REPORT_REJECTED, message=f"no diagnosis task reports {what}", ref=ref)
        state = await self._find(report, log)
        if state is None:
            log.warning("report_for_missing_task")
            return Error(code=JOB_GONE, message=f"task {report.route.job} no longer exists", ref=ref)
        task = state.task
        if (task.metadata.name, task.spec.node_name) != (report.route.job, report.route.node):
            text = f"task {report.job_uid} is {task.metadata.name} on node {task.spec.node_name}, not the route's"
            return Error(code=REPORT_REJECTED, message=text, ref=ref)
        outcome = await self._writes.write_result(state, report, log)
        if outcome is None:
            return Error(code=JOB_GONE, message=f"task {report.route.job} no longer exists", ref=ref)
        if outcome is Recorded.APPLIED:
            log.info("task_result_recorded", succ=report.succ)
        elif outcome is Recorded.FINAL:
            log.info("late_task_result_ignored", phase=state.task.status.phase, succ=report.succ)
        return ReportAck(job_uid=report.job_uid, seq=report.seq)

    async def _find(self, report: Report, log: Log) -> TaskState | None:
        """The reported Task, by uid; one this hub's watch has not shown yet is looked for by name."""
        await self.synced.wait()
        uid = report.job_uid
        state = self._by_uid.get(uid)
        if state is not None or uid in self._gone or not uid:
            return state
        # Another hub may have sent it, its watch ahead of this one's: the API server has the last word.
        outage = Outage(log, "task_lookup_retry")
        while True:
            try:
                found, _, _ = await self._api.list(TASKS, field_selector=f"metadata.name={report.route.job}")
                break
            except ApiError as exc:
                await outage.wait(exc)
        outage.recovered()
        for task in found:
            if task.metadata.uid == uid and uid not in self._gone:
                self._upsert(task)
        return self._by_uid.get(uid)
