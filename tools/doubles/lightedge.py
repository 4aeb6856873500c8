"""A lightweight in-process edge agent for integration tests and benchmarks.

It speaks the real wire protocol to a real hub - token handshake, Hello, heartbeats, RunAction
acknowledgements, an outbox of reports re-sent until acknowledged, resumption per job UID and
attempt - but fakes the device: each action takes ``delay`` seconds (plus up to ``jitter`` more, the
same for a node and action in every run) and fails when its name is in ``fail``. With
``attempts=False`` it plays an agent from before retries: no ``attempts`` capability, tasks keyed by
job UID alone, reports without an attempt. The real agent is ``nodetaskd --role=edge``.

Diagnosis Tasks (``diagnosis.kubediag.org/v1/task/...``, with :func:`roles.common.jobtypes.edge_job_types`)
are acknowledged and walked the same way, and a successful ``Run`` reports what
:func:`double_processor` makes of the request: a small fixed map, whatever the Operation's
processor. It is a double for load (the API writes and messages a diagnosis costs), not for what a
processor finds; the real processors are ``roles.edge.processors``.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

import anyio
import anyio.abc
import trio_websocket

from flows.diagnosis import job as diagnosis_job
from flows.nodejobs import imageprepulljob, nodeupgradejob
from flows.nodejobs.jobtype import EdgeJobType
from nodetask import messages
from nodetask.backoff import Backoff
from nodetask.messages import (
    PING_CAPABILITY,
    Ack,
    Autonomy,
    CacheDeleted,
    CacheObjects,
    Cancel,
    Error,
    Heartbeat,
    Hello,
    Report,
    ReportAck,
    RunAction,
    Welcome,
)
from nodetask.phases import ConditionStatus
from nodetask.route import Route
from schemas.v1alpha2 import ImagePrePullJobSpec, ImageStatus, NodeUpgradeJobSpec

DROPPED_CODES = frozenset({"report_rejected", "job_gone"})
RESULT_PREFIX = "lightedge."
"""Every key :func:`double_processor` reports starts with it."""


def _spread(node: str, action: str) -> float:
    """A fraction in [0, 1] fixed by the node and the action: results of many edges arrive spread out, and
    the same way in every run."""
    digest = hashlib.sha256(f"{node}/{action}".encode()).digest()
    return int.from_bytes(digest[:4], "big") / 0xFFFFFFFF


def double_processor(node: str, run: diagnosis_job.TaskRun) -> dict[str, str]:
    """The results a light edge reports for a Task: its node, the Operation, and how many request keys came
    (so a benchmark can see the earlier stages' results arrive), whatever the processor says."""
    propagated = sum(1 for key in run.request if f".{RESULT_PREFIX}" in key)
    return {
        f"{RESULT_PREFIX}node": node,
        f"{RESULT_PREFIX}operation": run.operation,
        f"{RESULT_PREFIX}requestKeys": str(len(run.request)),
        f"{RESULT_PREFIX}propagatedKeys": str(propagated),
    }


@dataclass(slots=True)
class Interval:
    """When this edge worked on a node task: first RunAction to the final action's end.

    Contained in the hub's view of the task (claim to final report written), so a peak overlap of
    these intervals above the job's concurrency proves the hubs over-dispatched.
    """

    job_uid: str
    start: float
    end: float = math.inf
    attempt: int = 1


@dataclass(slots=True)
class LightEdge:
    """One simulated edge. Run :meth:`run` in a task group; cancel it to stop the edge."""

    node: str
    url: str
    token: str
    job_types: Mapping[str, EdgeJobType]
    delay: float = 0.05
    jitter: float = 0.0
    fail: frozenset[str] = frozenset()
    version: str = "v1.0.0"
    ssl_context: ssl.SSLContext | None = None
    reconnect_delay: float = 0.2
    reconnect_cap: float = 0.0
    """Above ``reconnect_delay``: back off as the agent does (doubling up to this, each delay drawn from the upper
    half, reset once welcomed); otherwise retry every ``reconnect_delay``."""
    attempts: bool = True
    """Whether it keys tasks by job UID and attempt, as agents do since retries (else by job UID alone)."""
    pings: bool = False
    """List :data:`~nodetask.messages.PING_CAPABILITY` and, with a hub that lists it too, ping instead of
    sending Heartbeats (as the real agent does); otherwise behave as an agent from before pings."""
    capabilities: tuple[str, ...] = ()
    """Listed in Hello: with ``cache.v1`` the hub sends cache frames, counted in ``cache_replaces``."""
    gate: anyio.Event | None = None
    """When given, every action waits for it to be set before it ends: a test holds the edge's work in
    flight until it has done what must happen meanwhile (deleted the job, say), with no race on a delay."""

    outbox: dict[int, Report] = field(default_factory=dict)
    acked: list[Report] = field(default_factory=list)
    dropped: list[tuple[Report, str]] = field(default_factory=list)
    errors: list[Error] = field(default_factory=list)
    intervals: dict[str, Interval] = field(default_factory=dict)
    """By job UID for first attempts, ``<uid>#<attempt>`` for retries."""
    run_actions: list[RunAction] = field(default_factory=list)
    cancels: list[Cancel] = field(default_factory=list)
    close_codes: list[int] = field(default_factory=list)
    cache_replaces: dict[str, int] = field(default_factory=dict)
    """Whole collections received, by kind (the objects themselves are not kept)."""
    cache_frames: int = 0
    connects: int = 0
    _seq: int = 0
    _ws: trio_websocket.WebSocketConnection | None = None
    _connected: anyio.Event = field(default_factory=anyio.Event)
    _finished: dict[str, Report] = field(default_factory=dict)
    _cut: anyio.CancelScope | None = None
    _ready: anyio.abc.TaskStatus[None] | None = None

    @property
    def connected(self) -> bool:
        return self._ws is not None

    async def wait_connected(self) -> None:
        while self._ws is None:
            await self._connected.wait()

    def cut(self) -> None:
        """Drop the current connection abruptly (as a network failure would); the edge reconnects."""
        if self._cut is not None:
            self._cut.cancel()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Connect, serve, and reconnect after every loss until cancelled; ready once first connected."""
        self._ready = task_status
        backoff = Backoff(initial=self.reconnect_delay, cap=self.reconnect_cap)
        async with anyio.create_task_group() as work:
            while True:
                try:
                    await self._session(work, backoff)
                except* (OSError, trio_websocket.HandshakeError, trio_websocket.ConnectionClosed) as group:
                    for exc in group.exceptions:
                        if isinstance(exc, trio_websocket.ConnectionClosed) and exc.reason is not None:
                            self.close_codes.append(exc.reason.code)
                await anyio.sleep(
                    backoff.delay() if self.reconnect_cap > self.reconnect_delay else self.reconnect_delay
                )

    async def _session(self, work: anyio.abc.TaskGroup, backoff: Backoff) -> None:
        headers = [(b"authorization", f"Bearer {self.token}".encode())]
        url = f"{self.url.rstrip('/')}/nodes/{self.node}"
        async with trio_websocket.open_websocket_url(url, ssl_context=self.ssl_context, extra_headers=headers) as ws:
            capabilities = ((messages.ATTEMPTS_CAPABILITY,) if self.attempts else ()) + (
                (PING_CAPABILITY,) if self.pings else ()
            )
            hello = Hello(node=self.node, version=self.version, capabilities=(*capabilities, *self.capabilities))
            await ws.send_message(messages.encode(hello))
            welcome = messages.decode_downstream(await ws.get_message())
            if not isinstance(welcome, Welcome):
                raise trio_websocket.HandshakeError(f"expected welcome, got {welcome!r}")
            pinging = self.pings and PING_CAPABILITY in welcome.capabilities
            self.connects += 1
            backoff.reset()
            with anyio.CancelScope() as self._cut:
                self._ws = ws
                self._connected.set()
                self._connected = anyio.Event()
                if self._ready is not None:
                    self._ready.started()
                    self._ready = None
                try:
                    for report in sorted(self.outbox.values(), key=lambda r: r.seq):
                        await ws.send_message(messages.encode(report))
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._heartbeat, ws, welcome.heartbeat_interval, pinging)
                        # A hub answering pings may send no frame for long: its pongs say it is there.
                        await self._receive(ws, work, math.inf if pinging else welcome.heartbeat_interval * 3)
                        tg.cancel_scope.cancel()
                finally:
                    self._ws = None
            if self._cut.cancelled_caught:
                raise trio_websocket.ConnectionClosed(None)
            if ws.closed is not None:
                self.close_codes.append(ws.closed.code)

    async def _heartbeat(self, ws: trio_websocket.WebSocketConnection, interval: float, pinging: bool) -> None:
        while True:
            await anyio.sleep(interval)
            if pinging:
                with anyio.fail_after(interval * 3):
                    await ws.ping()
            else:
                await ws.send_message(messages.encode(Heartbeat(sent_at=anyio.current_time())))

    async def _receive(
        self, ws: trio_websocket.WebSocketConnection, work: anyio.abc.TaskGroup, deadline: float
    ) -> None:
        while True:
            with anyio.fail_after(deadline):
                frame = await ws.get_message()
            match messages.decode_downstream(frame):
                case RunAction() as run:
                    self.run_actions.append(run)
                    await ws.send_message(messages.encode(Ack(id=run.id)))
                    await self._start(run, work)
                case Cancel() as cancel:
                    self.cancels.append(cancel)
                case ReportAck(seq=seq):
                    report = self.outbox.pop(seq, None)
                    if report is not None:
                        self.acked.append(report)
                case CacheObjects(kind=kind, replace=replace):
                    self.cache_frames += 1
                    if replace:
                        self.cache_replaces[kind] = self.cache_replaces.get(kind, 0) + 1
                case CacheDeleted() | Autonomy():
                    self.cache_frames += 1
                case Error(code=code, ref=ref) as err:
                    self.errors.append(err)
                    if code in DROPPED_CODES and ref.isdigit() and int(ref) in self.outbox:
                        report = self.outbox.pop(int(ref))
                        self.dropped.append((report, code))
                case _:
                    pass

    def _attempt(self, run: RunAction) -> int:
        return max(run.attempt, 1) if self.attempts else 0

    def _key(self, uid: str, attempt: int) -> str:
        return uid if attempt <= 1 else f"{uid}#{attempt}"

    async def _start(self, run: RunAction, work: anyio.abc.TaskGroup) -> None:
        attempt = self._attempt(run)
        known = [i for i in self.intervals.values() if i.job_uid == run.job_uid]
        if known and (not self.attempts or max(i.attempt for i in known) >= attempt):
            # Re-delivered: never re-run; re-send the latest result so a restarted hub resynchronises.
            last = self._finished.get(run.job_uid)
            if last is not None:
                await self.send(
                    self._report(last.route, run.job_uid, last.action, last.succ, last.extend, attempt=last.attempt)
                )
            return
        key = self._key(run.job_uid, attempt)
        self.intervals[key] = Interval(job_uid=run.job_uid, start=anyio.current_time(), attempt=max(attempt, 1))
        work.start_soon(self._walk, run, key, attempt)

    async def _walk(self, run: RunAction, key: str, attempt: int) -> None:
        jt = self.job_types[run.route.job_type]
        action: str | None = run.action
        while action is not None:
            await anyio.sleep(self.delay + self.jitter * _spread(self.node, action))
            if self.gate is not None:
                await self.gate.wait()
            ok = action not in self.fail
            extend = self._extend(jt, run, action, ok)
            report = self._report(run.route, run.job_uid, action, ok, extend, attempt=attempt)
            self._finished[run.job_uid] = report
            action = jt.flow.next(action, ok)
            if action is None:
                self.intervals[key].end = anyio.current_time()
            await self.send(report)

    def _report(self, route: Route, uid: str, action: str, ok: bool, extend: str, *, attempt: int = 0) -> Report:
        self._seq += 1
        report = Report(
            route=route,
            job_uid=uid,
            seq=self._seq,
            action=action,
            succ=ok,
            reason="" if ok else f"{action} failed on {self.node}",
            extend=extend,
            attempt=attempt,
        )
        self.outbox[report.seq] = report
        return report

    async def ping(self) -> None:
        """Ping the hub and wait for its pong, when connected."""
        ws = self._ws
        if ws is None:
            return
        with contextlib.suppress(trio_websocket.ConnectionClosed):
            await ws.ping()

    async def send(self, msg: messages.Message) -> None:
        """Send when connected; otherwise the outbox keeps reports for the next connection."""
        ws = self._ws
        if ws is None:
            return
        with contextlib.suppress(trio_websocket.ConnectionClosed):
            await ws.send_message(messages.encode(msg))

    def _extend(self, jt: EdgeJobType, run: RunAction, action: str, ok: bool) -> str:
        if jt.flow is diagnosis_job.FLOW and action == diagnosis_job.RUN and ok:
            task, error = jt.read_spec(bytes(run.spec))
            if not isinstance(task, diagnosis_job.TaskRun):
                raise ValueError(f"a light edge got a Task it cannot read: {error}")
            return diagnosis_job.encode_results(double_processor(self.node, task))
        if jt.flow is imageprepulljob.FLOW and action == imageprepulljob.PULL:
            spec = imageprepulljob.JOB_TYPE.decode_spec(run.spec)
            assert isinstance(spec, ImagePrePullJobSpec)
            state = ConditionStatus.TRUE if ok else ConditionStatus.FALSE
            return imageprepulljob.encode_extend(
                tuple(ImageStatus(image=image, status=state) for image in spec.image_pre_pull_template.images)
            )
        if jt.flow is nodeupgradejob.FLOW and action == nodeupgradejob.UPGRADE and ok:
            spec = nodeupgradejob.JOB_TYPE.decode_spec(run.spec)
            assert isinstance(spec, NodeUpgradeJobSpec)
            return f"{self.version},{spec.version}"
        return ""
