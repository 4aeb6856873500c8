"""The edge agent: one connection to a hub at a time, node tasks walked locally, every result durable.

* A RunAction is stored before it is acknowledged; a task re-delivered with the same job UID is
  never run again - its latest recorded result is re-sent instead, so a restarted hub catches up.
* Each action's result and its report are written in one store transaction; reports leave the
  outbox in ``seq`` order and only when the hub acknowledges them (or refuses them for good), so
  an agent restart or an outage loses nothing: the outbox is flushed first on every connection.
* Tasks interrupted by an agent restart resume at their first unrecorded action.
* The connection loop tries the hub URLs in turn with capped, jittered backoff; three silent
  heartbeat intervals count as a dead session.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import anyio
import anyio.abc
import structlog
import trio_websocket

from flows.jobtype import JobType, NextStep, next_step, resume_at
from nodetask import messages
from nodetask.backoff import Backoff
from nodetask.clock import Clock
from nodetask.messages import (
    Ack,
    Cancel,
    Confirm,
    Error,
    Heartbeat,
    Hello,
    MessageError,
    Report,
    ReportAck,
    RunAction,
    Welcome,
)
from nodetask.route import Route
from roles.edge.context import Actions, Outcome, TaskContext
from roles.edge.settings import AgentSettings
from roles.edge.store import ActionProgress, EdgeStore, NodeTask, StoreError, TaskState
from roles.restart import RestartRequested

Log = structlog.typing.FilteringBoundLogger

FINAL_ERRORS: Final = frozenset({"report_rejected", "job_gone"})
CONTROL_TIMEOUT_S: Final = 5.0
DRAIN_BEFORE_RESTART_S: Final = 3.0
MAX_RAISED_REASON: Final = 500
"""Characters of an unexpected exception kept in the failure it becomes (its text may echo any input)."""
_FINISHED: Final = NextStep(None)


def _exclusive(jt: JobType | None) -> bool:
    return jt is not None and jt.exclusive


def control_socket(data_dir: Path) -> Path:
    """The agent's local control socket."""
    return data_dir / "control.sock"


HELLO_TIMEOUT_S: Final = 10.0


class EdgeAgent:
    """Run with :meth:`run`; cancel to stop (the store keeps everything for the next start)."""

    def __init__(
        self,
        *,
        settings: AgentSettings,
        store: EdgeStore,
        actions: Actions,
        job_types: Mapping[str, JobType],
        clock: Clock,
        log: Log,
    ) -> None:
        self.settings = settings
        self._store = store
        self._actions = actions
        self._types = job_types
        self._clock = clock
        self._log = log.bind(node=settings.node)
        self._work: anyio.abc.TaskGroup | None = None
        self._running: dict[str, anyio.CancelScope] = {}
        self._outbox_changed = anyio.Event()
        self._acked = anyio.Event()
        self._credentials: dict[str, tuple[Mapping[str, str], str]] = {}
        self.connected = anyio.Event()
        self.connects = 0
        self._ws: trio_websocket.WebSocketConnection | None = None

    async def wait_connected(self, within: float) -> bool:
        """Whether a hub session is (or becomes, within ``within`` seconds) established."""
        with anyio.move_on_after(within):
            while not self.connected.is_set():
                await self.connected.wait()
            return True
        return False

    def credentials(self, job_uid: str) -> tuple[Mapping[str, str], str]:
        """Registry credentials the hub sent with this job's RunAction, and its reason when it sent none.

        Kept in memory only: never written to disk. After an agent restart the hub re-sends them
        with the RunAction that resynchronises the task, before a resumed pull needs them.
        """
        return self._credentials.get(job_uid, ({}, ""))

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Resume stored tasks, then keep a hub connection until cancelled."""
        async with anyio.create_task_group() as work:
            self._work = work
            for task in await self._store.tasks(TaskState.RUNNING):
                self._log.info("task_resumed", job=task.route, action=task.current_action)
                self._start(task.job_uid)
            await work.start(self._serve_control)
            task_status.started()
            await self._connect_forever()

    # --------------------------------------------------------------------- local control socket

    async def _serve_control(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve ``<dataDir>/control.sock``: one-line commands from ``nodetaskd --role=edge --confirm``."""
        path = control_socket(self.settings.data_dir)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)  # a stale socket from a killed agent
            listener = await anyio.create_unix_listener(path)
            path.chmod(0o600)  # root (or the agent's user) only: confirming an upgrade is privileged
        except OSError as exc:
            # e.g. a data directory whose path is too long for a unix socket: the agent works without it.
            self._log.warning("control_socket_unavailable", path=str(path), error=str(exc))
            task_status.started()
            return
        task_status.started()
        async with listener:
            await listener.serve(self._control)

    async def _control(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            with anyio.move_on_after(CONTROL_TIMEOUT_S):
                request = (await stream.receive(1024)).decode(errors="replace").strip()
                command, _, job = request.partition(" ")
                if command != "confirm" or not job:
                    answer = f"error: unknown command {request!r}; expected: confirm <job name>"
                else:
                    answer = await self._confirm_by_name(job)
                await stream.send(f"{answer}\n".encode())

    async def _confirm_by_name(self, job: str) -> str:
        for task in await self._store.tasks(TaskState.WAITING_CONFIRMATION):
            if Route.parse(task.route).job == job:
                await self.confirm(task.job_uid)
                return f"ok: {job} resumes at {task.current_action}"
        return f"error: no task of job {job} is waiting for confirmation on this node"

    # ----------------------------------------------------------------------------- connection

    async def _connect_forever(self) -> None:
        backoff = Backoff(initial=0.5, cap=self.settings.reconnect_cap)
        for url in itertools.cycle(self.settings.hub_urls):
            try:
                await self._session(url)
                backoff.reset()
            except* (OSError, trio_websocket.HandshakeError, trio_websocket.ConnectionClosed, MessageError) as group:
                self._log.info("hub_connection_lost", url=url, error=str(group.exceptions[0]))
            await anyio.sleep(backoff.delay())

    async def _session(self, url: str) -> None:
        headers = [(b"authorization", f"Bearer {self.settings.token}".encode())]
        endpoint = f"{url.rstrip('/')}/nodes/{self.settings.node}"
        tls = self.settings.ssl_context if url.startswith("wss://") else None
        async with trio_websocket.open_websocket_url(endpoint, ssl_context=tls, extra_headers=headers) as ws:
            hello = Hello(node=self.settings.node, version=self.settings.version, capabilities=self._capabilities())
            await ws.send_message(messages.encode(hello))
            with anyio.fail_after(HELLO_TIMEOUT_S):
                welcome = messages.decode_downstream(await ws.get_message())
            if not isinstance(welcome, Welcome):
                raise MessageError(f"expected a welcome from {url}, got {type(welcome).__name__}")
            self.connects += 1
            self.connected.set()
            self._ws = ws
            self._log.info("hub_connected", hub=welcome.hub, url=url)
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._heartbeat, ws, welcome.heartbeat_interval)
                    tg.start_soon(self._send_outbox, ws)
                    await self._receive(ws, welcome.heartbeat_interval * self.settings.missed_heartbeats)
                    tg.cancel_scope.cancel()
            finally:
                self.connected = anyio.Event()
                self._ws = None

    def _capabilities(self) -> tuple[str, ...]:
        return tuple(sorted({f"{jt}/{action}" for jt, action in self._actions}))

    async def _heartbeat(self, ws: trio_websocket.WebSocketConnection, interval: float) -> None:
        while True:
            await ws.send_message(messages.encode(Heartbeat(sent_at=anyio.current_time())))
            await anyio.sleep(interval)

    async def _send_outbox(self, ws: trio_websocket.WebSocketConnection) -> None:
        # Everything unacknowledged goes out first, in seq order, then each new report as it lands.
        sent = 0
        while True:
            changed = self._outbox_changed
            for report in await self._store.pending(after=sent):
                try:
                    route = Route.parse(report.route)
                except ValueError as exc:
                    await self._store.drop(report.seq, f"unsendable route: {exc}")
                    continue
                frame = Report(
                    route=route,
                    job_uid=report.job_uid,
                    seq=report.seq,
                    action=report.action,
                    succ=report.succ,
                    finish_time=report.finish_time,
                    reason=report.reason,
                    extend=report.extend,
                )
                await ws.send_message(messages.encode(frame))
                sent = report.seq
            await changed.wait()

    async def _drain(self, within: float) -> bool:
        """Wait (at most ``within`` seconds) until the hub acknowledged everything in the outbox."""
        with anyio.move_on_after(within):
            while True:
                acked = self._acked
                if not await self._store.pending(limit=1):
                    return True
                await acked.wait()
        return False

    def _outbox_grew(self) -> None:
        self._outbox_changed.set()
        self._outbox_changed = anyio.Event()

    async def _receive(self, ws: trio_websocket.WebSocketConnection, deadline: float) -> None:
        while True:
            with anyio.fail_after(deadline):
                frame = await ws.get_message()
            try:
                msg = messages.decode_downstream(frame)
            except MessageError as exc:
                self._log.warning("bad_frame_from_hub", error=str(exc))
                continue
            match msg:
                case RunAction():
                    await self._on_run_action(ws, msg)
                case ReportAck(seq=seq):
                    await self._store.acknowledge(seq)
                    self._acked.set()
                    self._acked = anyio.Event()
                case Error(code=code, ref=ref, message=text) if code in FINAL_ERRORS and ref.isdigit():
                    self._log.warning("report_refused", seq=int(ref), code=code, error=text)
                    await self._store.drop(int(ref), f"{code}: {text}")
                case Error(code=code, message=text):
                    self._log.warning("hub_error", code=code, error=text)
                case Confirm(job_uid=uid):
                    await self.confirm(uid)
                case Cancel(job_uid=uid):
                    self._cancel(uid)
                case _:
                    pass

    # ----------------------------------------------------------------------------- node tasks

    async def _on_run_action(self, ws: trio_websocket.WebSocketConnection, run: RunAction) -> None:
        if run.credentials or run.credentials_error:
            self._credentials[run.job_uid] = (dict(run.credentials), run.credentials_error)
        try:
            task, new = await self._store.add_task(
                job_uid=run.job_uid,
                route=str(run.route),
                job_type=run.route.job_type,
                spec=bytes(run.spec),
                run_action_id=run.id,
                action=run.action,
            )
        except StoreError as exc:
            # Not acknowledged (the hub re-sends it after the next reconnect), but the reason is reported.
            self._log.error("task_not_stored", job=str(run.route), error=str(exc))
            await self._report_failure(run.route, run.job_uid, run.action, f"the edge cannot store the task: {exc}")
            return
        await ws.send_message(messages.encode(Ack(id=run.id)))
        if new:
            self._log.info("task_received", job=str(run.route), action=run.action)
            self._start(task.job_uid)
        elif task.job_uid not in self._running:
            await self._resend_latest(task)

    async def _resend_latest(self, task: NodeTask) -> None:
        """A re-delivered task: never run again, report the newest recorded result again."""
        progress = await self._store.progress(task.job_uid)
        if progress:
            last = progress[-1]
            await self._store.append(
                route=task.route,
                job_uid=task.job_uid,
                action=last.action,
                succ=last.succ,
                finish_time=last.finish_time,
                reason=last.reason,
                extend=last.extend,
            )
            self._outbox_grew()

    def _start(self, job_uid: str) -> None:
        assert self._work is not None
        if job_uid not in self._running:
            scope = self._running[job_uid] = anyio.CancelScope()
            self._work.start_soon(self._walk, job_uid, scope, name=f"task {job_uid}")

    def _cancel(self, job_uid: str) -> None:
        scope = self._running.get(job_uid)
        if scope is not None:
            self._log.info("task_cancelled", uid=job_uid)
            scope.cancel()

    async def confirm(self, job_uid: str) -> bool:
        """Release a task waiting for confirmation; it resumes with the action after its confirmation point."""
        task = await self._store.get_task(job_uid)
        if task is None or task.state is not TaskState.WAITING_CONFIRMATION:
            return False
        # A paused task's current action is already the one after the confirmation point.
        await self._store.set_task_state(job_uid, state=TaskState.RUNNING, current_action=task.current_action)
        self._log.info("task_confirmed", job=task.route)
        self._start(job_uid)
        return True

    async def _walk(self, job_uid: str, scope: anyio.CancelScope) -> None:
        try:
            with scope:
                try:
                    await self._walk_task(job_uid)
                except RestartRequested:
                    # Let the hub have the reports already recorded before the agent goes away,
                    # so that progress shows up now rather than after the restart.
                    await self._drain(DRAIN_BEFORE_RESTART_S)
                    raise
            if scope.cancelled_caught:
                task = await self._store.get_task(job_uid)
                if task is not None and task.state is not TaskState.FINISHED:
                    cancelled = Outcome(False, "cancelled: the job was deleted or interrupted in the cloud")
                    await self._record(task, task.current_action, cancelled)
        except StoreError as exc:
            # The store could not record a result; the task resumes from its last record next start.
            self._log.error("task_stalled", uid=job_uid, error=str(exc))
        finally:
            del self._running[job_uid]

    async def _walk_task(self, job_uid: str) -> None:
        task = await self._store.get_task(job_uid)
        if task is None:
            return
        log = self._log.bind(job=task.route)
        jt = self._types.get(task.job_type)
        if jt is None:
            await self._record(task, task.current_action, Outcome(False, f"unknown job type {task.job_type}"))
            return
        spec, problem = jt.read_spec(task.spec)
        done = {p.action: p.succ for p in await self._store.progress(job_uid)}
        action = resume_at(jt, task.current_action, done)
        while action is not None:
            action_fn = self._actions.get((task.job_type, action))
            if problem:
                outcome = Outcome(False, problem)
            elif action not in jt.flow:
                outcome = Outcome(False, f"invalid {task.job_type} action {action}")
            elif action_fn is None:
                outcome = Outcome(False, f"action {action} is not supported by this agent")
            else:
                log.info("action_started", action=action)
                ctx = TaskContext(
                    task=task,
                    spec=spec,
                    node=self.settings.node,
                    version=self.settings.version,
                    data_dir=self.settings.data_dir,
                    thresholds=self.settings.thresholds,
                    store=self._store,
                    config_file=self.settings.config_file,
                    health_deadline=self.settings.health_deadline,
                    wait_connected=self.wait_connected,
                )
                try:
                    outcome = await action_fn(ctx)
                except Exception as exc:
                    if _propagates(exc):
                        raise
                    # A fault no action foresaw (a bug, an input nothing checked) fails this task only:
                    # raised, it would end the agent, and the stored task would end every restart alike.
                    log.exception("action_raised", action=action)
                    outcome = Outcome(False, f"action {action} raised {type(exc).__name__}: {exc}"[:MAX_RAISED_REASON])
            step = _FINISHED if problem else next_step(jt, spec, action, outcome.succ)
            await self._record(task, action, outcome, step)
            log.info("action_finished", action=action, succ=outcome.succ, reason=outcome.reason)
            if step.pause:
                log.info("waiting_for_confirmation")
                return
            action = step.action

    async def _record(self, task: NodeTask, action: str, outcome: Outcome, step: NextStep = _FINISHED) -> None:
        after = step.action
        state = (
            TaskState.FINISHED if after is None else TaskState.WAITING_CONFIRMATION if step.pause else TaskState.RUNNING
        )
        progress = ActionProgress(
            job_uid=task.job_uid,
            action=action,
            succ=outcome.succ,
            finish_time=self._clock.stamp(),
            reason="" if outcome.succ else outcome.reason or f"action {action} failed",
            extend=outcome.extend,
        )
        # Shielded: a Cancel arriving mid-write must not leave a result unreported.
        with anyio.CancelScope(shield=True):
            try:
                await self._store.record_result(progress, state=state, current_action=after or action)
                if state is TaskState.FINISHED and _exclusive(self._types.get(task.job_type)):
                    await self._store.end_exclusive(task.job_uid)
            except StoreError as exc:
                await self._report_unrecorded(task, action, exc)
                raise
        self._outbox_grew()

    async def _report_unrecorded(self, task: NodeTask, action: str, error: StoreError) -> None:
        """The store cannot take a result (disk full, read-only): tell the hub, as a failure."""
        self._log.error("result_not_recorded", job=task.route, action=action, error=str(error))
        reason = f"the edge cannot record the result of {action}: {error}"
        await self._report_failure(Route.parse(task.route), task.job_uid, action, reason)

    async def _report_failure(self, route: Route, job_uid: str, action: str, reason: str) -> None:
        """Send a failure report outside the outbox (``seq`` 0, nothing to acknowledge): best effort.

        For when the store itself is what fails; the task stays where its last recorded result left
        it and resumes from there once the store works again.
        """
        ws = self._ws
        if ws is None:
            return
        report = Report(
            route=route,
            job_uid=job_uid,
            seq=0,
            action=action,
            succ=False,
            finish_time=self._clock.stamp(),
            reason=reason,
        )
        with contextlib.suppress(trio_websocket.ConnectionClosed):
            await ws.send_message(messages.encode(report))


def _propagates(exc: Exception) -> bool:
    """Whether an action's exception is the agent's to handle (a restart, a store that fails), not a fault."""
    wanted = (RestartRequested, StoreError)
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(wanted) is not None
    return isinstance(exc, wanted)
