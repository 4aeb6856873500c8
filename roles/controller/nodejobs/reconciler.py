"""The controller's I/O shell: watch jobs and nodes, one serial worker per job, write decisions.

Each job has a worker that wakes when the job or a node changes, or when the job's earliest node
deadline arrives (a cancel scope, not a polled ticker). A wake always reconciles the newest cached
object, and every status write goes through :meth:`Kube.update_status`, which re-reads on conflict,
so the controller never overwrites what a hub wrote meanwhile: it only changes the fields it owns.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import anyio
import anyio.abc
import msgspec
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from flows.nodejobs import decide, retry
from nodetask.clock import Clock, format_time
from nodetask.phases import JobPhase
from roles.common.events import job_event, record_event
from roles.kube import ApiError, Deleted, Invalid, Kube, NotFound, Relisted, Upserted, WatchEvent
from roles.kube.resources import NODES, Resource, job_resource
from roles.kube.retrying import Outage
from schemas import v1alpha2
from schemas.access import counted
from schemas.core import Node
from schemas.kinds import Kind
from schemas.retry import requested_retry

Log = structlog.typing.FilteringBoundLogger
Key = tuple[str, str]
COMPONENT = "nodetaskd-controller"


def _ignore(kind: Kind, seconds: float) -> None:
    return None


def _nudge(wake: MemoryObjectSendStream[None]) -> None:
    # A full one-slot buffer means a wake is already pending: pokes coalesce.
    with contextlib.suppress(anyio.WouldBlock):
        wake.send_nowait(None)


class Reconciler:
    """Reconciles every job of ``kinds``. Run it with :meth:`run` inside a task group."""

    def __init__(
        self,
        *,
        kube: Kube,
        clock: Clock,
        log: Log,
        kinds: Sequence[Kind],
        on_reconciled: Callable[[Kind, float], None] = _ignore,
    ) -> None:
        self._kube = kube
        self._clock = clock
        self._log = log
        self._kinds = {k.plural: k for k in kinds}
        self._jobs: dict[Key, Any] = {}
        self._nodes: dict[str, Node] = {}
        self._nodes_synced = anyio.Event()
        self._wake: dict[Key, MemoryObjectSendStream[None]] = {}
        self._invalid_reported: set[str] = set()
        self._announced: set[str] = set()
        """Names of owed Events this term recorded and cleared: a pass on a copy older than the clearing
        skips them (another create would only be refused as a duplicate)."""
        self.reconciles = 0
        self._on_reconciled = on_reconciled
        """Called with each pass's kind and duration in seconds (the reconcile-latency metric)."""

    @property
    def jobs(self) -> Mapping[Key, Any]:
        """A read-only view of the job cache, keyed by (plural, name): metrics read it at scrape time."""
        return MappingProxyType(self._jobs)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch and reconcile until cancelled; ready once every watch has delivered its first list."""
        async with anyio.create_task_group() as tg:
            node_send, node_recv = anyio.create_memory_object_stream[WatchEvent](max_buffer_size=math.inf)
            tg.start_soon(self._consume_nodes, node_recv)
            await tg.start(self._kube.watch, NODES, node_send)
            for kind in self._kinds.values():
                send, recv = anyio.create_memory_object_stream[WatchEvent](max_buffer_size=math.inf)
                tg.start_soon(self._consume_jobs, kind, recv, tg)  # job workers live as long as the reconciler
                await tg.start(self._kube.watch, job_resource(kind), send)
            task_status.started()

    async def _consume_nodes(self, events: MemoryObjectReceiveStream[WatchEvent]) -> None:
        async with events:
            async for event in events:
                match event:
                    case Relisted(objects=objects):
                        self._nodes = {n.metadata.name: n for n in objects}
                        self._nodes_synced.set()
                    case Upserted(obj=node):
                        self._nodes[node.metadata.name] = node
                    case Deleted(obj=node):
                        self._nodes.pop(node.metadata.name, None)
                    case _:
                        continue
                self._wake_all()

    async def _consume_jobs(
        self, kind: Kind, events: MemoryObjectReceiveStream[WatchEvent], workers: anyio.abc.TaskGroup
    ) -> None:
        async with events:
            async for event in events:
                match event:
                    case Relisted(objects=objects, invalid=invalid):
                        current = {(kind.plural, j.metadata.name) for j in objects}
                        for key in [k for k in self._jobs if k[0] == kind.plural and k not in current]:
                            del self._jobs[key]
                            self._poke(key, workers)
                        for job in objects:
                            self._upsert(kind, job, workers)
                        for bad in invalid:
                            await self._report_invalid(kind, bad)
                    case Upserted(obj=job):
                        self._upsert(kind, job, workers)
                    case Deleted(obj=job):
                        key = (kind.plural, job.metadata.name)
                        self._jobs.pop(key, None)
                        self._poke(key, workers)
                    case Invalid() as bad:
                        await self._report_invalid(kind, bad)

    def _upsert(self, kind: Kind, job: Any, workers: anyio.abc.TaskGroup) -> None:
        key = (kind.plural, job.metadata.name)
        self._jobs[key] = job
        self._poke(key, workers)

    def _poke(self, key: Key, workers: anyio.abc.TaskGroup) -> None:
        wake = self._wake.get(key)
        if wake is None:
            if key not in self._jobs:
                return
            wake, recv = anyio.create_memory_object_stream[None](max_buffer_size=1)
            self._wake[key] = wake
            workers.start_soon(self._worker, key, recv, name=f"job {key[0]}/{key[1]}")
        _nudge(wake)

    def _wake_all(self) -> None:
        for wake in self._wake.values():
            _nudge(wake)

    async def _worker(self, key: Key, wake: MemoryObjectReceiveStream[None]) -> None:
        kind = self._kinds[key[0]]
        log = self._log.bind(job=key[1], kind=kind.kind)
        outage = Outage(log, "reconcile_failed", initial=1.0, cap=30.0)
        await self._nodes_synced.wait()
        try:
            async with wake:
                while (job := self._jobs.get(key)) is not None:
                    started = anyio.current_time()
                    try:
                        due = await self._reconcile(kind, job, log)
                        outage.recovered()
                    except NotFound:
                        due = None
                    except ApiError as exc:
                        due = anyio.current_time() + outage.failed(exc)
                    self._on_reconciled(kind, anyio.current_time() - started)
                    with anyio.move_on_after(math.inf if due is None else max(0.0, due - anyio.current_time())):
                        await wake.receive()
        finally:
            del self._wake[key]

    def _connected(self, node: str) -> bool:
        return decide.hub_of(self._nodes.get(node)) != ""

    async def _reconcile(self, kind: Kind, job: Any, log: Log) -> float | None:
        """One pass over ``job``; returns the loop time to look again (a node deadline), or None."""
        self.reconciles += 1
        resource = job_resource(kind)
        meta = job.metadata
        if await self._finalizer(kind, job, log):
            return None
        owed = retry.pending_event(job)
        if owed is not None and owed.name not in self._announced and await self._announce(kind, job, owed, log):
            return None  # the clearing's watch event brings the job back
        if job.status.phase is JobPhase.NONE:
            updated = await self._kube.update_status(resource, meta.name, self._initialise(kind))
            if updated is not None:
                log.info("job_initialised", phase=updated.status.phase, nodes=len(updated.status.node_status))
                await self._record(kind, updated, decide.notices(job.status, updated.status), log)
            return None
        retry_asked = requested_retry(meta.annotations, job.status.retry) is not None
        if retry_asked or decide.is_final(kind, job.status.phase):
            if retry_asked:
                # Its write's watch event brings the job back, to be advanced from its new status.
                await self._retry(kind, job, log)
            elif counted(job) is not job:
                # A late report may revive a node after the job ended (its phase stays, as KubeEdge's):
                # the counts follow. Checked on the cached copy first: final jobs wake often.
                await self._kube.update_status(resource, meta.name, self._recount())
            return None
        before = job.status
        updated = await self._kube.update_status(resource, meta.name, self._advance(kind))
        if updated is None:
            return None
        if updated.status != before:
            await self._record(kind, updated, decide.notices(before, updated.status), log)
            if updated.status.phase is not before.phase:
                log.info("job_phase", phase=updated.status.phase, reason=updated.status.reason)
        due = decide.next_deadline(updated, connected=self._connected)
        return None if due is None else self._clock.loop_time(due)

    async def _finalizer(self, kind: Kind, job: Any, log: Log) -> bool:
        """Take the finalizer off a deleted job, or put it on a new one: whether the pass ends there (its
        write's watch event brings the job back)."""
        resource = job_resource(kind)
        meta = job.metadata
        if meta.deletion_timestamp is not None:
            if kind.finalizer in meta.finalizers:
                rest = [f for f in meta.finalizers if f != kind.finalizer]
                await self._kube.merge_patch(
                    resource, meta.name, {"metadata": {"finalizers": rest, "resourceVersion": meta.resource_version}}
                )
                log.info("finalizer_removed")
            return True
        if kind.finalizer not in meta.finalizers:
            await self._kube.merge_patch(
                resource,
                meta.name,
                {
                    "metadata": {
                        "finalizers": [*meta.finalizers, kind.finalizer],
                        "resourceVersion": meta.resource_version,
                    }
                },
            )
            log.info("finalizer_added")
            return True
        return False

    async def _retry(self, kind: Kind, job: Any, log: Log) -> None:
        """Handle the retry annotation's new value: the decision and its record land in one status update."""
        decided: list[tuple[Any, retry.Retried | None]] = []

        def mutate(fresh: Any) -> Any:
            outcome = retry.retried(kind, fresh, self._nodes, now=self._clock.now())
            decided[:] = [(fresh.status, outcome)]
            return None if outcome is None else msgspec.structs.replace(fresh, status=outcome.status)

        updated = await self._kube.update_status(job_resource(kind), job.metadata.name, mutate, current=job)
        # update_status returns only after a decision (it raises otherwise): the last one is what was written.
        before, outcome = decided[-1]
        if updated is None or outcome is None:
            return  # handled meanwhile, by another controller
        log.info(
            "job_retried" if not outcome.refusal else "retry_refused",
            value=outcome.value,
            attempt=outcome.attempt,
            pending=len(outcome.pending),
            settled=len(outcome.settled),
            refusal=outcome.refusal,
        )
        owed = retry.pending_event(updated)
        if owed is not None:
            await self._announce(kind, updated, owed, log)
        await self._record(kind, updated, decide.notices(before, updated.status), log)

    async def _announce(self, kind: Kind, job: Any, owed: v1alpha2.PendingEvent, log: Log) -> bool:
        """Record the Event ``job``'s status owes, then clear it from the status: whether both are done.

        Cleared only once the Event exists, so that a controller dying in between leaves it owed; the
        next one's create of the same name then finds it (409) and clears it without a second Event.
        """
        now = format_time(self._clock.now())
        event = job_event(
            kind,
            job,
            reason=owed.reason,
            message=owed.message,
            type_=owed.type,
            component=COMPONENT,
            now=now,
            name=owed.name,
        )
        if not await record_event(self._kube, event, log):
            return False  # still owed: the job's next pass tries again
        cleared = functools.partial(retry.announced, owed=owed)
        await self._kube.update_status(job_resource(kind), job.metadata.name, cleared, current=job)
        self._announced.add(owed.name)
        log.info("retry_event_recorded", reason=owed.reason, event_name=owed.name)
        return True

    def _initialise(self, kind: Kind) -> Any:
        def mutate(job: Any) -> Any:
            if job.status.phase is not JobPhase.NONE:
                return None
            return msgspec.structs.replace(job, status=decide.initial_status(kind, job, self._nodes))

        return mutate

    def _recount(self) -> Any:
        def mutate(job: Any) -> Any:
            new = counted(job)
            return None if new is job else new

        return mutate

    def _advance(self, kind: Kind) -> Any:
        def mutate(job: Any) -> Any:
            if decide.is_final(kind, job.status.phase) or job.status.phase is JobPhase.NONE:
                return None
            status = decide.next_status(kind, job, now=self._clock.now(), connected=self._connected)
            return None if status is None else msgspec.structs.replace(job, status=status)

        return mutate

    async def _record(self, kind: Kind, job: Any, notices: list[decide.Notice], log: Log) -> None:
        """Write the notices as Events on the job; a failed Event write is logged, never fatal."""
        now = format_time(self._clock.now())
        for notice in notices:
            event = job_event(
                kind, job, reason=notice.reason, message=notice.message, type_=notice.type, component=COMPONENT, now=now
            )
            await record_event(self._kube, event, log)

    async def _report_invalid(self, kind: Kind, bad: Invalid) -> None:
        """A job that does not decode fails with a reason naming the field, once per object."""
        if bad.uid in self._invalid_reported:
            return
        resource: Resource[Any] = job_resource(kind)
        patch = {"status": {"phase": JobPhase.FAILURE.value, "reason": f"invalid {kind.kind}: {bad.error}"}}
        try:
            await self._kube.merge_patch_raw(resource, bad.name, patch, subresource="status")
        except ApiError as exc:
            self._log.warning("invalid_job_not_reported", job=bad.name, error=str(exc))
            return
        self._invalid_reported.add(bad.uid)
        self._log.warning("invalid_job", job=bad.name, kind=kind.kind, error=bad.error)
