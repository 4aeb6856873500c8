"""The cloud hub: edge sessions over websockets, job runners, and reports written into job status.

:class:`Hub` owns the root task group and composes the parts, each in a module of its own:

* :mod:`~roles.cloud.jobs.watch`: the job watch keeps a cache of every job, with a status writer each
  and a :class:`~roles.cloud.jobs.runner.JobRunner` for every running one;
* :mod:`~roles.cloud.transport.door`: the front door, from TCP accept and the handshake caps to an edge
  whose node name and bearer token checked out, handed over as a :class:`~nodetask.link.Link`;
* :mod:`~roles.cloud.transport.session_handler`: a session from Hello to close, one writer task each
  (:mod:`~roles.cloud.sessions`); its Node is marked (:mod:`~roles.cloud.nodes.marks`) unless the Node
  watch shows it marked already (:mod:`~roles.cloud.nodes.marked_nodes`), and the node offered to every runner;
* :mod:`~roles.cloud.jobs.reports`: a report is applied through the job's status writer and
  acknowledged only after that write; :mod:`~roles.cloud.transport.kubeedge_http` takes KubeEdge's HTTP
  reports the same way. Which room answers a session's report is a table by job type
  (:func:`report_answers`);
* :mod:`~roles.cloud.jobs.image_secrets`: registry credentials for a job's images;
* :mod:`~roles.cloud.tasks.watch`: diagnosis Tasks, sent to their nodes and their results written on the
  same protocol, reports from the edges' outboxes included (:mod:`~roles.cloud.tasks.status_writes`);
* :mod:`~roles.cloud.cache.streams`: each cache session's edge kept a copy of its node's objects,
  from one shared watch per kind; :mod:`~roles.cloud.nodes.autonomy_conditions`: the Autonomy condition
  its edge reports, written on its Node.
* :mod:`~roles.cloud.relay`: devices' tunnels to the API server (:mod:`~roles.cloud.relay.api_relay`) and
  their node's certificate, issued through the CSR API (:mod:`~roles.cloud.relay.node_credentials`).

Shutdown (SIGTERM): every session is closed with 1001 "going away" while the websocket server is
still running, within ``close_grace`` seconds, so that edges reconnect to another hub at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Final, Protocol

import anyio
import anyio.abc
import structlog

from flows.diagnosis import job as diagnosis_job
from flows.nodejobs.changes import RecordOutcome
from flows.nodejobs.jobtype import JobType
from nodetask import messages
from nodetask.clock import Clock
from nodetask.messages import Error, Report, ReportAck
from roles.cloud.api import HubApi
from roles.cloud.cache.streams import CacheStreams
from roles.cloud.jobs.image_secrets import ImageSecrets
from roles.cloud.jobs.reports import Reports
from roles.cloud.jobs.runner import JobRunner
from roles.cloud.jobs.watch import Jobs
from roles.cloud.metrics import HubMetrics
from roles.cloud.nodes.autonomy_conditions import AutonomyConditions
from roles.cloud.nodes.marked_nodes import MarkedNodes
from roles.cloud.nodes.marks import FAILED, SKIPPED, WRITTEN, NodeMarks, PendingMarks
from roles.cloud.relay.api_relay import ApiAddress, ApiRelay
from roles.cloud.relay.desk import RelayDesk
from roles.cloud.relay.node_credentials import NodeCredentialIssuer
from roles.cloud.sessions import Session, SessionTable
from roles.cloud.settings import HubSettings
from roles.cloud.tasks.watch import Tasks
from roles.cloud.transport.auth import TokenBook
from roles.cloud.transport.door import WebSocketDoor
from roles.cloud.transport.ingress import LogThrottle
from roles.cloud.transport.kubeedge_http import TaskStatusEndpoint
from roles.cloud.transport.session_handler import ServeEdge, SessionHandler
from roles.common.health import HttpRoute
from roles.common.server_tls import ServerTls

__all__ = ["EdgeDoor", "Hub", "HubSettings", "report_answers"]

Log = structlog.typing.FilteringBoundLogger

Answer = Callable[[Report, Log], Awaitable[ReportAck | Error]]
"""Records a report from its node's session; the answer the edge gets once it is written."""


def report_answers(job_types: Mapping[str, JobType], *, reports: Reports, tasks: Tasks) -> Mapping[str, Answer]:
    """Who answers a report, by its route's job type: every node job type's reports are written into the
    job's status, diagnosis Tasks' into the Task's."""
    answers: dict[str, Answer] = dict.fromkeys(job_types, reports.answer)
    answers[diagnosis_job.RESOURCE_TYPE] = tasks.answer
    return MappingProxyType(answers)


class EdgeDoor(Protocol):
    """Where edges come in: each authenticated edge handed to ``serve_edge`` in a task the door owns.

    Ready (``task_status.started``) with the port it listens on once edges can come.
    """

    async def __call__(self, serve_edge: ServeEdge, *, task_status: anyio.abc.TaskStatus[int]) -> None: ...


class Hub:
    """One cloud hub instance. Run with :meth:`run` (websockets) or :meth:`serve` (any door)."""

    def __init__(
        self,
        *,
        kube: HubApi,
        clock: Clock,
        log: Log,
        settings: HubSettings,
        job_types: Mapping[str, JobType],
        metrics: HubMetrics,
    ) -> None:
        self._log = log.bind(hub=settings.hub_id)
        self.settings = settings
        self.metrics = metrics
        self.sessions = SessionTable()
        self.tokens: Final = TokenBook(
            kube, namespace=settings.token_namespace, log=self._log, on_read=metrics.token_reads.inc
        )
        self.jobs: Final = Jobs(
            kube,
            types=job_types,
            sessions=self.sessions,
            credentials=ImageSecrets(kube, namespaces=settings.image_secret_namespaces).credentials,
            clock=clock,
            settings=settings,
            metrics=metrics,
            log=self._log,
        )
        self.reports: Final = Reports(jobs=self.jobs, types=job_types, clock=clock, settings=settings, metrics=metrics)
        self.tasks: Final = Tasks(kube, sessions=self.sessions, clock=clock, settings=settings, log=self._log)
        self._answers = report_answers(job_types, reports=self.reports, tasks=self.tasks)
        self.marks: Final = PendingMarks(anyio.current_time)
        # One Node watch per hub: the cache streams' when they are on, else the marked Nodes' own.
        self.marked_nodes: Final = MarkedNodes(
            None if settings.cache_streams else kube, hub_id=settings.hub_id, log=self._log
        )
        settled = {outcome: metrics.node_marks.labels(outcome=outcome) for outcome in (WRITTEN, SKIPPED, FAILED)}
        self.node_marks: Final = NodeMarks(
            kube,
            self.marks,
            hub_id=settings.hub_id,
            close_grace=settings.close_grace,
            pending_limit=settings.mark_pending_limit,
            seen=self.marked_nodes.seen,
            awaiting=self.marked_nodes.awaiting,
            settled=lambda outcome: settled[outcome].inc(),
            log=self._log,
        )
        metrics.marks_pending.set_function(lambda: len(self.marks))
        metrics.mark_oldest.set_function(self.marks.oldest_age)
        self.cache: Final = CacheStreams(
            kube, settings=settings, metrics=metrics, log=self._log, node_events=self.marked_nodes.apply
        )
        self.conditions: Final = AutonomyConditions(
            kube, clock=clock, metrics=metrics, hub_id=settings.hub_id, interval=settings.autonomy_condition_interval
        )
        throttle = LogThrottle()
        self.websockets: Final = WebSocketDoor(
            settings=settings, tokens=self.tokens, metrics=metrics, throttle=throttle, log=self._log
        )
        relay_address = None if settings.api_relay is None else ApiAddress(*settings.api_relay)
        self.relay: Final = ApiRelay(relay_address, metrics=metrics, max_tunnels=settings.max_tunnels_per_node)
        certificates = metrics.node_certificates
        self.issuer: Final = NodeCredentialIssuer(
            kube,
            ca_bundle=settings.node_ca_bundle,
            timeout=settings.node_certificate_timeout,
            on_outcome=lambda outcome: certificates.labels(outcome=outcome).inc(),
        )
        self._handler = SessionHandler(
            settings=settings,
            sessions=self.sessions,
            metrics=metrics,
            throttle=throttle,
            admit=self._admit,
            unmark=self.node_marks.unmark,
            on_report=self._apply_report,
            cache=self.cache,
            conditions=self.conditions,
            relay=RelayDesk(self.relay, self.issuer),
            log=self._log,
        )
        self._task_status = TaskStatusEndpoint(
            types=job_types, reports=self.reports, tokens=self.tokens, metrics=metrics, log=self._log
        )
        self.port = 0

    async def run(
        self,
        *,
        host: str,
        port: int,
        ssl_context: ServerTls | None,
        task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Watch jobs and Tasks and serve edge websockets until cancelled; ready (with the bound port) once all are."""

        async def door(serve_edge: ServeEdge, *, task_status: anyio.abc.TaskStatus[int]) -> None:
            await self.websockets.serve(
                serve_edge, host=host, port=port, ssl_context=ssl_context, task_status=task_status
            )

        await self.serve(door, task_status=task_status)

    async def serve(
        self, door: EdgeDoor, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Watch jobs and serve the edges ``door`` lets in until cancelled; ready once both are."""
        async with anyio.create_task_group() as tg:
            await tg.start(self.jobs.run)
            await tg.start(self.tasks.run)
            await tg.start(self.tokens.watch)
            tg.start_soon(self.node_marks.watch)
            tg.start_soon(self._handler.watch)
            await tg.start(self.conditions.run)
            if self.cache.enabled:
                await tg.start(self.cache.run)
            await tg.start(self.marked_nodes.run)
            door_scope = anyio.CancelScope(shield=True)
            door_ready = anyio.Event()
            tg.start_soon(self._open, door, door_scope, door_ready)
            await door_ready.wait()
            task_status.started(self.port)
            try:
                await anyio.sleep_forever()
            finally:
                with anyio.CancelScope(shield=True):
                    self.node_marks.bound_unmarks()
                    await self._handler.close_all()
                    door_scope.cancel()

    async def _open(self, door: EdgeDoor, scope: anyio.CancelScope, ready: anyio.Event) -> None:
        # Shielded so that sessions can still complete their close handshake during shutdown;
        # serve() cancels the scope once they have.
        with scope:
            async with anyio.create_task_group() as tg:
                self.port = await tg.start(door, self._handler.serve)
                ready.set()

    def http_routes(self) -> tuple[HttpRoute, ...]:
        """``POST /task/{taskType}/name/{job}/node/{node}/status``, KubeEdge's report endpoint (see kubeedge_http)."""
        return self._task_status.routes()

    def ready(self) -> bool:
        """Serving edges, holding a synced job cache, and no Node mark stuck (see :meth:`why_not_ready`)."""
        return not self.why_not_ready()

    def why_not_ready(self) -> str:
        """What keeps the hub from being ready, or empty when it is."""
        if not self.jobs.synced.is_set() or not self.tasks.synced.is_set() or self.port == 0:
            return "starting: job or task cache not synced or edge listener not bound yet"
        return self.node_marks.stuck()

    def runners(self) -> list[JobRunner]:
        """The runners this hub started, oldest first, current or ended (the last RUNNER_HISTORY)."""
        return self.jobs.runners()

    @property
    def unmarks_pending(self) -> int:
        """Unmarks of ended sessions not yet answered."""
        return self.node_marks.unmarks_pending

    async def record(
        self, jt: JobType, job: str, node: str, result: messages.ActionResult, *, uid: str, log: Log
    ) -> RecordOutcome | None:
        """Write ``result`` into job ``job``'s status; None if the job is gone (see :meth:`Reports.record`)."""
        return await self.reports.record(jt, job, node, result, uid=uid, log=log)

    async def _admit(self, node: str, version: str, log: Log) -> None:
        """Mark the Node as held by this hub, offering the node to every job runner and its Tasks once the
        first attempt is answered (a refused mark is retried meanwhile).

        The session's end cancels this task: see :meth:`NodeMarks.mark` for what then happens to the mark.
        """

        def offer() -> None:
            self.jobs.offer(node)
            self.tasks.offer(node)

        await self.node_marks.mark(node, version, log, answered=offer)

    async def _apply_report(self, session: Session, report: Report, log: Log) -> None:
        # A report's task is the session's own: cancelled only when the session ends. A job type no one
        # answers for is refused by the node jobs' reports, which name it.
        answer = self._answers.get(report.route.job_type, self.reports.answer)
        await session.send(await answer(report, log), own=True)
