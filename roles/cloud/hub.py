"""The cloud hub: edge sessions over websockets, job runners, and reports written into job status.

Who does what:

* the job watch keeps a cache of every job; a job in Init or InProgress gets a
  :class:`~roles.cloud.runner.JobRunner` (keyed by UID: a re-created job's runner starts only after
  the old one has unwound), and every job gets a :class:`~roles.cloud.status_writer.StatusWriter`;
* each TCP connection takes a handshake place (refused at once when none is free), then the
  session handler checks the node named in the path and the edge's bearer token, trades the
  handshake place for a session place, reads Hello,
  records on the Node which hub holds the session and the agent version, offers the node to every
  runner, and then serves frames until the edge goes or stops heartbeating;
* a report is applied through the job's status writer and acknowledged only after that write.

No error raised while serving one connection ends the hub: :meth:`Hub._connection` is the
supervision boundary, which logs it, counts it and closes only that connection.

Shutdown (SIGTERM): every session is closed with 1001 "going away" while the websocket server is
still running, within ``close_grace`` seconds, so that edges reconnect to another hub at once.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import math
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Final

import anyio
import anyio.abc
import structlog
import trio
import trio_websocket
from anyio.streams.memory import MemoryObjectReceiveStream

from flows.jobtype import JobType
from nodetask import messages
from nodetask.backoff import Backoff
from nodetask.clock import Clock
from nodetask.messages import (
    Ack,
    Error,
    Heartbeat,
    Hello,
    MessageError,
    Report,
    ReportAck,
    Upstream,
    Welcome,
)
from nodetask.names import clip, object_name_problem
from nodetask.registry_auth import DockerConfig, encode_credentials, parse_docker_config_json
from roles.cloud.auth import AuthError, TokenBook, bearer_token
from roles.cloud.changes import RecordOutcome, dispatchable, record
from roles.cloud.ingress import Admission, LogThrottle, PeerWatch, Slots, connection_limits, fd_limit
from roles.cloud.marks import PendingMarks
from roles.cloud.metrics import HubMetrics
from roles.cloud.runner import JobRunner
from roles.cloud.sessions import Session, SessionTable
from roles.cloud.status_writer import StatusWriter
from roles.events import job_event, record_event
from roles.http import Request, Response, Route
from roles.kube import ApiError, Conflict, Deleted, Kube, NotFound, Relisted, Upserted, WatchEvent
from roles.kube.errors import too_large
from roles.kube.resources import NODES, SECRETS, job_resource
from schemas.access import counted
from schemas.core import AGENT_VERSION_ANNOTATION, HUB_ANNOTATION

Log = structlog.typing.FilteringBoundLogger
EVENT_COMPONENT: Final = "nodetaskd-cloud"
"""The component named in the Events a hub records on jobs."""
Key = tuple[str, str]

EDGE_PATH_PREFIX: Final = "/nodes/"
GOING_AWAY: Final = 1001
HEARTBEAT_MISSED: Final = 4008
REPLACED: Final = 4009
PROTOCOL: Final = 1002
RUNNER_HISTORY: Final = 256
DOCKER_CONFIG_KEY: Final = ".dockerconfigjson"

# KubeEdge's v1alpha1 task types, accepted by the HTTP endpoint as aliases.
LEGACY_TASK_TYPES: Final = {"upgrade": "nodeupgradejob", "prepull": "imageprepulljob"}

# Error codes a hub answers reports with; an edge drops a report answered with either.
REPORT_REJECTED: Final = "report_rejected"
JOB_GONE: Final = "job_gone"


@dataclass(frozen=True, slots=True)
class HubSettings:
    """What the hub needs from the cloud role's configuration."""

    hub_id: str
    heartbeat_interval: float = 15.0
    missed_heartbeats: int = 3
    coalesce_window: float = 0.2
    max_frame_bytes: int = 1 << 20
    token_namespace: str = "kube-system"
    image_secret_namespaces: tuple[str, ...] = ("kube-system",)
    """The only namespaces whose Secrets a job's ``imageSecrets`` may name."""
    close_grace: float = 5.0
    hello_timeout: float = 10.0
    handshake_timeout: float = 10.0
    """Seconds from accept for an edge's TLS and websocket handshake; an idle connection is closed after it."""
    max_handshakes: int | None = None
    """Edge connections at once not yet past their token check (None: from RLIMIT_NOFILE, see ingress)."""
    max_sessions: int | None = None
    """Edge connections at once past it (None: from RLIMIT_NOFILE, see ingress)."""
    compact_status_above: int | None = 1000
    """Jobs of more nodes keep a compact status entry per succeeded node (None: never)."""
    mark_pending_limit: float = 120.0
    """A Node mark pending longer than this makes the hub not ready (its API writes are stuck)."""


@dataclass(slots=True)
class _JobState:
    job: Any
    writer: StatusWriter
    runner: JobRunner | None = None


def _fresher(new: Any, old: Any) -> bool:
    # resourceVersions are etcd revisions; a write's answer may arrive after a newer watch event.
    try:
        return int(new.metadata.resource_version) >= int(old.metadata.resource_version)
    except ValueError:
        return True


class Hub:
    """One cloud hub instance. Run with :meth:`run`."""

    def __init__(
        self,
        *,
        kube: Kube,
        clock: Clock,
        log: Log,
        settings: HubSettings,
        job_types: Mapping[str, JobType],
        metrics: HubMetrics,
    ) -> None:
        self._kube = kube
        self._clock = clock
        self._log = log.bind(hub=settings.hub_id)
        self.settings = settings
        self._types = dict(job_types)
        self._by_plural = {jt.kind.plural: jt for jt in job_types.values()}
        self.metrics = metrics
        self.sessions = SessionTable()
        self.tokens: Final = TokenBook(
            kube, namespace=settings.token_namespace, log=self._log, on_read=metrics.token_reads.inc
        )
        self._jobs: dict[Key, _JobState] = {}
        self._synced = anyio.Event()
        self._jobs_tg: anyio.abc.TaskGroup | None = None
        self._history: deque[JobRunner] = deque(maxlen=RUNNER_HISTORY)
        self.port = 0
        fds = fd_limit()
        derived = connection_limits(fds)
        self._handshakes = Slots(settings.max_handshakes or derived.handshakes)
        self._session_places = Slots(settings.max_sessions or derived.sessions)
        metrics.handshakes.set_function(lambda: self._handshakes.used)
        self._throttle = LogThrottle()
        self._log.info(
            "connection_limits",
            max_handshakes=self._handshakes.total,
            max_sessions=self._session_places.total,
            fd_limit=fds,
        )
        self.marks: Final = PendingMarks(anyio.current_time)
        self._unmarking: set[anyio.CancelScope] = set()
        self._unmark_deadline = math.inf
        metrics.marks_pending.set_function(lambda: len(self.marks))
        metrics.mark_oldest.set_function(self.marks.oldest_age)

    # --------------------------------------------------------------------------------- lifecycle

    async def run(
        self,
        *,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Watch jobs and serve edges until cancelled; ready (with the bound port) once both are."""
        async with anyio.create_task_group() as tg:
            self._jobs_tg = tg
            for jt in self._types.values():
                send, recv = anyio.create_memory_object_stream[WatchEvent](max_buffer_size=math.inf)
                tg.start_soon(self._consume_jobs, jt, recv)
                await tg.start(self._kube.watch, job_resource(jt.kind), send)
            self._synced.set()
            await tg.start(self.tokens.watch)
            tg.start_soon(self._watch_marks)
            server_scope = anyio.CancelScope(shield=True)
            server_ready = anyio.Event()
            tg.start_soon(self._serve, host, port, ssl_context, server_scope, server_ready)
            await server_ready.wait()
            task_status.started(self.port)
            try:
                await anyio.sleep_forever()
            finally:
                with anyio.CancelScope(shield=True):
                    self._bound_unmarks()
                    await self._close_sessions()
                    server_scope.cancel()

    async def _serve(
        self,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        scope: anyio.CancelScope,
        ready: anyio.Event,
    ) -> None:
        # Shielded so that sessions can still complete their close handshake during shutdown;
        # run() cancels the scope once they have.
        with scope:
            listeners = await trio.open_tcp_listeners(port, host=host)
            self.port = listeners[0].socket.getsockname()[1]
            serve = functools.partial(self._connection, ssl_context=ssl_context)
            async with anyio.create_task_group() as tg:
                await tg.start(trio.serve_listeners, serve, listeners)
                ready.set()

    async def _close_sessions(self) -> None:
        sessions = self.sessions.all()
        if not sessions:
            return
        self._log.info("closing_sessions", count=len(sessions))
        with anyio.move_on_after(self.settings.close_grace):
            async with anyio.create_task_group() as tg:
                for session in sessions:
                    tg.start_soon(session.ws.aclose, GOING_AWAY, "hub shutting down")

    # ------------------------------------------------------------------------------------- jobs

    async def _consume_jobs(self, jt: JobType, events: MemoryObjectReceiveStream[WatchEvent]) -> None:
        plural = jt.kind.plural
        async with events:
            async for event in events:
                match event:
                    case Relisted(objects=objects):
                        names = {job.metadata.name for job in objects}
                        for key in [k for k in self._jobs if k[0] == plural and k[1] not in names]:
                            await self._forget(key)
                        for job in objects:
                            await self._upsert(jt, job)
                    case Upserted(obj=job):
                        await self._upsert(jt, job)
                    case Deleted(obj=job):
                        await self._forget((plural, job.metadata.name))
                    case _:
                        continue

    def _on_written(self, jt: JobType) -> Any:
        def written(job: Any) -> None:
            self.metrics.status_batches.inc()
            state = self._jobs.get((jt.kind.plural, job.metadata.name))
            if state is not None and state.job.metadata.uid == job.metadata.uid and _fresher(job, state.job):
                state.job = job
                if state.runner is not None:
                    state.runner.update(job)

        return written

    def _on_too_large(self, jt: JobType, name: str) -> Callable[[ApiError], Awaitable[None]]:
        async def tell(error: ApiError) -> None:
            state = self._jobs.get((jt.kind.plural, name))
            if state is None:
                return
            limit = self.settings.compact_status_above
            event = job_event(
                jt.kind,
                state.job,
                reason="StatusTooLarge",
                message=(
                    f"the API server refuses this job's status as too large ({error.message}); node results"
                    " wait on the edges and are written if the job shrinks. Split it into smaller jobs"
                    + (f" (jobs over {limit} nodes already keep compact entries)" if limit is not None else "")
                ),
                type_="Warning",
                component=EVENT_COMPONENT,
                now=self._clock.stamp(),
                instance=self.settings.hub_id,
            )
            with anyio.move_on_after(10):
                await record_event(self._kube, event, self._log.bind(job=name))

        return tell

    def _on_failed(self, error: ApiError) -> None:
        self.metrics.status_failures.labels(too_large="true" if too_large(error) else "false").inc()

    def _cached(self, plural: str, name: str) -> Any:
        def newest() -> Any:
            state = self._jobs.get((plural, name))
            return None if state is None else state.job

        return newest

    async def _upsert(self, jt: JobType, job: Any) -> None:
        assert self._jobs_tg is not None
        key = (jt.kind.plural, job.metadata.name)
        state = self._jobs.get(key)
        if state is None:
            writer = StatusWriter(
                self._kube,
                job_resource(jt.kind),
                job.metadata.name,
                window=self.settings.coalesce_window,
                log=self._log.bind(job=job.metadata.name),
                on_written=self._on_written(jt),
                cached=self._cached(jt.kind.plural, job.metadata.name),
                finish=counted,
                on_too_large=self._on_too_large(jt, job.metadata.name),
                on_failed=self._on_failed,
            )
            self._jobs_tg.start_soon(writer.run)
            state = self._jobs[key] = _JobState(job=job, writer=writer)
        elif state.job.metadata.uid == job.metadata.uid and not _fresher(job, state.job):
            return
        state.job = job
        runner = state.runner
        if runner is not None and runner.uid != job.metadata.uid:
            await self._stop_runner(state)
            runner = None
        wanted = dispatchable(job) and job.metadata.deletion_timestamp is None
        if runner is not None:
            runner.update(job)
            if not wanted:
                await self._stop_runner(state)
        elif wanted:
            credentials, credentials_error = await self._credentials(job)
            runner = JobRunner(
                job=job,
                job_type=jt,
                sessions=self.sessions,
                writer=state.writer,
                clock=self._clock,
                log=self._log,
                on_dispatch=self.metrics.dispatch_latency.observe,
                credentials=credentials,
                credentials_error=credentials_error,
            )
            state.runner = runner
            self._history.append(runner)
            await self._jobs_tg.start(runner.run)

    async def _credentials(self, job: Any) -> tuple[dict[str, str], str]:
        """Each image's registry credentials from the job's ``imageSecrets``, or why there are none.

        Only the entry of each image's own registry is sent, and only to this job's nodes.
        """
        template = getattr(job.spec, "image_pre_pull_template", None)
        if template is None or not template.image_secrets:
            return {}, ""
        try:
            config = await self._docker_config(template.image_secrets)
            auths = {image: config.auth_for(image) for image in template.images}
        except ValueError as exc:
            return {}, f"imageSecrets {template.image_secrets}: {exc}"
        return {image: encode_credentials(auth) for image, auth in auths.items() if auth is not None}, ""

    async def _docker_config(self, reference: str) -> DockerConfig:
        """The parsed ``.dockerconfigjson`` of Secret ``namespace/name``; ValueError says what is wrong."""
        namespace, _, name = reference.partition("/")
        if not namespace or not name:
            raise ValueError("not of the form namespace/name")
        allowed = self.settings.image_secret_namespaces
        if namespace not in allowed:
            # Refused before any read: the job's author need not be allowed to read that Secret.
            raise ValueError(
                f"the hubs read image secrets only in {', '.join(allowed) or 'no namespace'}"
                " (their imageSecretNamespaces setting)"
            )
        try:
            secret = await self._kube.get(SECRETS, name, namespace=namespace)
        except NotFound:
            raise ValueError("no such Secret") from None
        except ApiError as exc:
            raise ValueError(f"cannot be read: {exc}") from None
        try:
            return parse_docker_config_json(base64.b64decode(secret.data.get(DOCKER_CONFIG_KEY, ""), validate=True))
        except binascii.Error as exc:
            raise ValueError(f"{DOCKER_CONFIG_KEY} is not base64: {exc}") from None

    async def _stop_runner(self, state: _JobState) -> None:
        runner = state.runner
        if runner is None:
            return
        state.runner = None
        runner.stop()
        await runner.finished.wait()
        self._log.info("runner_stopped", job=runner.name, uid=runner.uid, dispatched=len(runner.dispatched))

    async def _forget(self, key: Key) -> None:
        state = self._jobs.pop(key, None)
        if state is None:
            return
        await self._stop_runner(state)
        state.writer.close()

    def runners(self) -> list[JobRunner]:
        """The runners this hub started, oldest first, current or ended (the last RUNNER_HISTORY)."""
        return list(self._history)

    # --------------------------------------------------------------------------------- sessions

    async def _connection(self, stream: trio.SocketStream, *, ssl_context: ssl.SSLContext | None) -> None:
        """One edge connection, from accept to close: the hub's per-connection supervision boundary."""
        admission = Admission(handshakes=self._handshakes, sessions=self._session_places)
        if not admission.enter():
            await self._refuse_connection(stream, tls=ssl_context is not None)
            return
        try:
            async with trio.open_nursery() as nursery:  # the websocket's reader task runs here
                request = await self._upgrade(nursery, stream, ssl_context)
                if request is not None:
                    await self._handle(request, admission)
                nursery.cancel_scope.cancel()
        except* Exception:
            # The one place a hub catches every error (C12): a bug met while serving one edge must
            # end that edge's connection, never the process and every other edge's session with it.
            # (except*: a cancellation arriving at the same time still propagates.)
            self.metrics.connection_errors.labels(transport="websocket").inc()
            self._log.exception("edge_connection_failed", peer=_peer(stream))
        finally:
            admission.leave()
            with anyio.CancelScope(shield=True):
                await stream.aclose()

    async def _upgrade(
        self, nursery: trio.Nursery, stream: trio.SocketStream, ssl_context: ssl.SSLContext | None
    ) -> trio_websocket.WebSocketRequest | None:
        """The edge's websocket request, once its TLS and HTTP handshake are done; None if they fail or stall."""
        with anyio.move_on_after(self.settings.handshake_timeout):
            served: trio.abc.Stream = stream
            if ssl_context is not None:
                served = trio.SSLStream(stream, ssl_context, server_side=True, https_compatible=True)
                try:
                    await served.do_handshake()
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    # A failed TLS handshake (the SSLError is the cause) or a peer that went.
                    self._log.debug("edge_handshake_failed", peer=_peer(stream), error=repr(exc.__cause__ or exc))
                    return None
            watched = PeerWatch(served)
            async with anyio.create_task_group() as race:
                race.start_soon(_cancel_when_gone, watched, race.cancel_scope)
                request = await trio_websocket.wrap_server_stream(
                    nursery, watched, max_message_size=self.settings.max_frame_bytes
                )
                race.cancel_scope.cancel()
                return request
            return None  # the peer went before its request was complete
        self.metrics.handshake_timeouts.inc()
        self._warn(self._log, "edge_handshake_timed_out", peer=_peer(stream), seconds=self.settings.handshake_timeout)
        return None

    async def _refuse_connection(self, stream: trio.SocketStream, *, tls: bool) -> None:
        """Close a connection beyond ``maxHandshakes`` before any TLS or websocket work."""
        self.metrics.connections_refused.labels(limit="maxHandshakes").inc()
        self._warn(
            self._log,
            "edge_connection_refused",
            peer=_peer(stream),
            limit="maxHandshakes",
            max_handshakes=self._handshakes.total,
        )
        try:
            if not tls:
                # Plain HTTP can still say why; a TLS client learns it from its retry.
                with anyio.move_on_after(0.5):
                    await stream.send_all(_BUSY)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            with anyio.CancelScope(shield=True):
                await stream.aclose()

    async def _refuse(self, request: trio_websocket.WebSocketRequest, status: int, reason: str, node: str) -> None:
        self.metrics.auth_failures.labels(status=str(int(status))).inc()
        self._warn(self._log, "edge_refused", node=clip(node, 64), status=int(status), error=reason)
        await request.reject(status, body=reason.encode())

    def _warn(self, log: Log, event: str, **values: object) -> None:
        """A warning caused by what a peer did, at most a few a second per event (the counters count every one)."""
        dropped = self._throttle.allow(event, anyio.current_time())
        if dropped is not None:
            log.warning(event, **values, **({"suppressed": dropped} if dropped else {}))

    async def _handle(self, request: trio_websocket.WebSocketRequest, admission: Admission) -> None:
        path = request.path.split("?", 1)[0]
        if not path.startswith(EDGE_PATH_PREFIX):
            await self._refuse(request, HTTPStatus.NOT_FOUND, f"expected the path {EDGE_PATH_PREFIX}<node>", "")
            return
        # Checked before anything else: the name goes into API paths and Secret names.
        node = path[len(EDGE_PATH_PREFIX) :]
        problem = object_name_problem(node)
        if problem:
            await self._refuse(request, HTTPStatus.BAD_REQUEST, f"node name {clip(node)!r} {problem}", node)
            return
        try:
            await self.tokens.check(node, bearer_token(request.headers))
        except AuthError as exc:
            await self._refuse(request, exc.status, str(exc), node)
            return
        if not admission.promote():
            self.metrics.connections_refused.labels(limit="maxSessions").inc()
            reason = f"this hub holds its limit of {self._session_places.total} sessions (maxSessions)"
            await self._refuse(request, HTTPStatus.SERVICE_UNAVAILABLE, reason, node)
            return
        ws = await request.accept()
        log = self._log.bind(node=node)
        hello = await self._hello(ws, node, log)
        if hello is None:
            return
        session = Session(
            node=node, version=hello.version, capabilities=hello.capabilities, ws=ws, on_sent=self._count_out
        )
        # Welcome goes out before the session is visible to the runners: it must be the first frame.
        welcome = Welcome(hub=self.settings.hub_id, heartbeat_interval=self.settings.heartbeat_interval)
        if not await self._send(session, welcome):
            return
        replaced = self.sessions.add(session)
        removed: bool | None = None
        try:
            if replaced is not None:
                log.info("session_replaced")
                await replaced.ws.aclose(REPLACED, "replaced by a newer session")
            log.info("edge_connected", version=clip(hello.version, 64))
            # The session reads (and echoes heartbeats) while its Node mark waits its turn: a fleet
            # reconnecting at once must not time its sessions out behind thousands of marks.
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._admit, node, hello.version, log)
                try:
                    await self._receive(session, log)
                finally:
                    # Out of the table at once, so nothing more is dispatched to it, while a mark under
                    # way finishes (see _admit) so that the unmark below comes after it.
                    removed = self.sessions.remove(session)
                    tg.cancel_scope.cancel()
        finally:
            current = self.sessions.remove(session) if removed is None else removed
            with anyio.CancelScope(shield=True):
                if current:
                    await self._unmark(node, log)
                with anyio.move_on_after(self.settings.close_grace):
                    await ws.aclose(GOING_AWAY if ws.closed is None else 1000)
            log.info("edge_disconnected", reason=str(ws.closed))

    async def _hello(self, ws: trio_websocket.WebSocketConnection, node: str, log: Log) -> Hello | None:
        with anyio.move_on_after(self.settings.hello_timeout):
            try:
                frame = await ws.get_message()
            except trio_websocket.ConnectionClosed:
                return None
            try:
                msg = messages.decode_upstream(frame)
            except MessageError as exc:
                msg = None
                problem = str(exc)
            else:
                problem = (
                    ""
                    if isinstance(msg, Hello) and msg.node == node
                    else "the first frame must be a Hello for this node"
                )
            if isinstance(msg, Hello) and not problem:
                self.metrics.messages_in.labels(op="hello").inc()
                return msg
            self.metrics.rejected.labels(reason="bad_hello").inc()
            self._warn(log, "bad_hello", error=clip(problem))
            with contextlib.suppress(trio_websocket.ConnectionClosed):
                await ws.send_message(messages.encode(Error(code="bad_hello", message=clip(problem))))
            await ws.aclose(PROTOCOL, "expected hello")
            return None
        log.warning("hello_timed_out")
        await ws.aclose(PROTOCOL, "no hello")
        return None

    async def _send(self, session: Session, msg: messages.Downstream) -> bool:
        return await session.send(msg)

    def _count_out(self, op: str) -> None:
        self.metrics.messages_out.labels(op=op).inc()

    async def _receive(self, session: Session, log: Log) -> None:
        deadline = self.settings.heartbeat_interval * self.settings.missed_heartbeats
        async with anyio.create_task_group() as tg:
            while True:
                with anyio.move_on_after(deadline) as scope:
                    try:
                        frame = await session.ws.get_message()
                    except trio_websocket.ConnectionClosed:
                        break
                if scope.cancelled_caught:
                    log.warning("heartbeat_missed", seconds=deadline)
                    await session.ws.aclose(HEARTBEAT_MISSED, "no heartbeat")
                    break
                try:
                    msg: Upstream = messages.decode_upstream(frame)
                except MessageError as exc:
                    await self._reject(session, "malformed", str(exc), log)
                    continue
                self.metrics.messages_in.labels(op=type(msg).__struct_config__.tag).inc()
                match msg:
                    case Heartbeat():
                        await self._send(session, Heartbeat(sent_at=msg.sent_at))
                    case Ack(id=msg_id):
                        latency = session.acked(msg_id)
                        if latency is not None:
                            self.metrics.ack_latency.observe(latency)
                    case Report():
                        if msg.route.node != session.node:
                            await self._reject(
                                session,
                                "foreign_node",
                                f"report for node {msg.route.node} refused",
                                log,
                                ref=str(msg.seq),
                            )
                            continue
                        # Each report waits for its write without holding up heartbeats or other reports.
                        tg.start_soon(self._apply_report, session, msg, log)
                    case Error(code=code, message=text):
                        self._warn(log, "edge_error", code=clip(code, 64), error=clip(text))
                    case Hello():
                        await self._reject(session, "unexpected", "hello was already received", log)
            tg.cancel_scope.cancel()

    async def _reject(self, session: Session, reason: str, text: str, log: Log, *, ref: str = "") -> None:
        self.metrics.rejected.labels(reason=reason).inc()
        self._warn(log, "frame_rejected", reason=reason, error=clip(text))
        await self._send(session, Error(code=reason, message=clip(text), ref=ref))

    # --------------------------------------------------------------------------------- upstream

    async def _apply_report(self, session: Session, report: Report, log: Log) -> None:
        started = anyio.current_time()
        log = log.bind(job=report.route.job, action=report.action, seq=report.seq)
        jt = self._types.get(report.route.job_type)
        if jt is None:
            await self._send(
                session,
                Error(code=REPORT_REJECTED, message=f"unknown job type {report.route.job_type}", ref=str(report.seq)),
            )
            return
        outcome = await self.record(jt, report.route.job, report.route.node, report.result, uid=report.job_uid, log=log)
        if outcome is None:
            await self._send(
                session, Error(code=JOB_GONE, message=f"job {report.route.job} no longer exists", ref=str(report.seq))
            )
        elif outcome.acknowledge:
            self.metrics.report_latency.observe(anyio.current_time() - started)
            await self._send(session, ReportAck(job_uid=report.job_uid, seq=report.seq))
        else:
            self.metrics.rejected.labels(reason=REPORT_REJECTED).inc()
            log.warning("report_rejected", error=outcome.error)
            await self._send(session, Error(code=REPORT_REJECTED, message=outcome.error, ref=str(report.seq)))

    async def record(
        self, jt: JobType, job: str, node: str, result: messages.ActionResult, *, uid: str, log: Log
    ) -> RecordOutcome | None:
        """Write ``result`` into job ``job``'s status; None if the job is gone.

        API errors other than NotFound are retried with backoff for as long as the caller waits:
        a report is either written or still held by the edge, never lost in between.
        """
        await self._synced.wait()
        backoff = Backoff(initial=0.2, cap=5.0)
        while True:
            state = self._jobs.get((jt.kind.plural, job))
            if state is None:
                log.warning("report_for_missing_job")
                return None
            if not uid:
                uid = state.job.metadata.uid
            try:
                outcome: RecordOutcome = await state.writer.submit(
                    record(
                        jt,
                        node,
                        result,
                        uid=uid,
                        now=self._clock.stamp(),
                        compact_above=self.settings.compact_status_above,
                    )
                )
            except NotFound:
                log.warning("report_for_missing_job")
                return None
            except ApiError as exc:
                log.warning("report_write_retry", error=str(exc))
                await anyio.sleep(backoff.delay())
                continue
            if outcome.applied:
                log.info("report_applied")
            return outcome

    # ------------------------------------------------------------------------ KubeEdge HTTP path

    def http_routes(self) -> tuple[Route, ...]:
        """``POST /task/{taskType}/name/{job}/node/{node}/status``, KubeEdge's report endpoint.

        The body is KubeEdge's upstream message ``{action, succ, finishTime, reason, extend}``; the
        caller authenticates as ``node`` with its bearer token. The answer ``ok`` comes only after
        the status write, like a websocket ReportAck.
        """
        return (Route("POST", "/task/", self._task_status, prefix=True),)

    def ready(self) -> bool:
        """Serving edges, holding a synced job cache, and no Node mark stuck (see :meth:`why_not_ready`)."""
        return not self.why_not_ready()

    def why_not_ready(self) -> str:
        """What keeps the hub from being ready, or empty when it is."""
        if not self._synced.is_set() or self.port == 0:
            return "starting: job cache not synced or edge listener not bound yet"
        age = self.marks.oldest_age()
        if age > self.settings.mark_pending_limit:
            return (
                f"Node marks stuck: {len(self.marks)} pending, the oldest for {age:.0f} s"
                f" (markPendingLimit {self.settings.mark_pending_limit:g} s)"
            )
        return ""

    async def _task_status(self, request: Request) -> Response:
        target = await self._task_target(request)
        if isinstance(target, Response):
            return target
        jt, job, node = target
        try:
            result = messages.decode_result(request.body)
        except MessageError as exc:
            self.metrics.rejected.labels(reason="malformed").inc()
            return Response.text(HTTPStatus.BAD_REQUEST, str(exc))
        log = self._log.bind(node=node, job=job, action=result.action, via="http")
        outcome = await self.record(jt, job, node, result, uid="", log=log)
        if outcome is None:
            return Response.text(HTTPStatus.NOT_FOUND, f"job {job} not found")
        if not outcome.acknowledge:
            self.metrics.rejected.labels(reason=REPORT_REJECTED).inc()
            return Response.text(HTTPStatus.UNPROCESSABLE_ENTITY, outcome.error)
        return Response.text(HTTPStatus.OK, "ok")

    async def _task_target(self, request: Request) -> tuple[JobType, str, str] | Response:
        """The job type, job and node a report is for, once the caller proved it is that node."""
        parts = request.path.strip("/").split("/")
        if len(parts) != 7 or (parts[0], parts[2], parts[4], parts[6]) != ("task", "name", "node", "status"):
            return Response.text(HTTPStatus.NOT_FOUND, "expected /task/{taskType}/name/{job}/node/{node}/status")
        task_type, job, node = parts[1], parts[3], parts[5]
        for what, name in (("node name", node), ("job name", job)):
            problem = object_name_problem(name)
            if problem:
                self.metrics.auth_failures.labels(status=str(int(HTTPStatus.BAD_REQUEST))).inc()
                return Response.text(HTTPStatus.BAD_REQUEST, f"{what} {clip(name)!r} {problem}")
        jt = self._types.get(LEGACY_TASK_TYPES.get(task_type, task_type))
        if jt is None:
            return Response.text(HTTPStatus.NOT_FOUND, f"unknown task type {clip(task_type, 64)!r}")
        scheme, _, token = (request.header("authorization") or "").partition(" ")
        try:
            await self.tokens.check(node, token.strip() if scheme.lower() == "bearer" else "")
        except AuthError as exc:
            self.metrics.auth_failures.labels(status=str(exc.status)).inc()
            return Response.text(exc.status, str(exc))
        return jt, job, node

    # ------------------------------------------------------------------------------ node marks

    async def _admit(self, node: str, version: str, log: Log) -> None:
        """Mark the Node as held by this hub, then offer the node to every job runner.

        The mark waits its turn among the API client's requests for as long as the session lives,
        however long a connect storm makes that. The session's end cancels this task: see
        :meth:`_mark_node` for what then happens to the mark.
        """
        with self.marks.pending():
            await self._mark_node(node, version, log)
        for state in list(self._jobs.values()):
            if state.runner is not None:
                state.runner.offer(node)

    async def _mark_node(self, node: str, version: str, log: Log) -> None:
        annotations = {HUB_ANNOTATION: self.settings.hub_id, AGENT_VERSION_ANNOTATION: version}
        try:
            # Cancelled, a mark still waiting for its turn is dropped (nothing was sent), and one
            # already sent is awaited for closeGrace: it could otherwise land after the unmark that
            # follows the session's end.
            await self._kube.merge_patch(
                NODES, node, {"metadata": {"annotations": annotations}}, grace=self.settings.close_grace
            )
        except ApiError as exc:
            # The session still works; the controller then sees the node as not connected.
            log.warning("node_not_marked", error=str(exc))

    async def _watch_marks(self) -> None:
        """Log when Node marks start and stop being stuck (readiness and metrics say so meanwhile)."""
        stuck = False
        while True:
            await anyio.sleep(min(10.0, self.settings.mark_pending_limit / 4))
            now_stuck = self.marks.oldest_age() > self.settings.mark_pending_limit
            if now_stuck and not stuck:
                self._log.warning("node_marks_stuck", error=self.why_not_ready())
            elif stuck and not now_stuck:
                self._log.info("node_marks_flowing", pending=len(self.marks))
            stuck = now_stuck

    async def _unmark(self, node: str, log: Log) -> None:
        """Take this hub's mark off the Node of an ended session.

        No deadline while the hub runs: when many sessions end at once, their unmarks queue behind
        the API client's limit just as a storm's marks do, and one cut off would leave the Node
        claiming a session that is gone. Only a stopping hub bounds them, by ``close_grace``.
        """
        with anyio.CancelScope(deadline=self._unmark_deadline) as scope:
            self._unmarking.add(scope)
            try:
                await self._unmark_node(node, log)
            finally:
                self._unmarking.discard(scope)
        if scope.cancelled_caught:
            log.warning("node_not_unmarked", error="the hub stopped before its turn came")

    def _bound_unmarks(self) -> None:
        """The hub is stopping: unmarks under way or to come get ``close_grace`` from now."""
        self._unmark_deadline = anyio.current_time() + self.settings.close_grace
        for scope in self._unmarking:
            scope.deadline = min(scope.deadline, self._unmark_deadline)

    @property
    def unmarks_pending(self) -> int:
        """Unmarks of ended sessions not yet answered."""
        return len(self._unmarking)

    async def _unmark_node(self, node: str, log: Log) -> None:
        for _ in range(5):
            try:
                current = await self._kube.get(NODES, node)
                if current.metadata.annotations.get(HUB_ANNOTATION) != self.settings.hub_id:
                    return  # another hub holds the node now
                patch = {
                    "metadata": {
                        "resourceVersion": current.metadata.resource_version,
                        "annotations": {HUB_ANNOTATION: None},
                    }
                }
                await self._kube.merge_patch(NODES, node, patch)
                return
            except Conflict:
                continue
            except ApiError as exc:
                log.warning("node_not_unmarked", error=str(exc))
                return


_BUSY_TEXT: Final = b"this hub is at its limit of handshakes (maxHandshakes)\n"
_BUSY: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n"
    b"retry-after: 5\r\nconnection: close\r\n\r\n%s" % (len(_BUSY_TEXT), _BUSY_TEXT)
)


async def _cancel_when_gone(watched: PeerWatch, scope: anyio.CancelScope) -> None:
    await watched.gone.wait()
    scope.cancel()


def _peer(stream: trio.SocketStream) -> str:
    try:
        host, port, *_ = stream.socket.getpeername()
    except OSError:
        return "?"
    return f"{host}:{port}"
