"""Node tasks walked on the device: each action run in its flow's order, each result recorded with its report.

* A task's walk runs in its own cancel scope, owned by the runner's task group; a Cancel from the
  hub cancels it, and the cancellation is recorded (and reported) as the task's failure. So does a
  retry of the job (a later attempt) arriving while an earlier attempt still walks: the earlier one
  ends first, then the retry replaces it in the store.
* Each action's result and its report are written in one store transaction (:meth:`_record`),
  shielded, so a cancellation never leaves a result unreported.
* Tasks interrupted by an agent restart resume at their first unrecorded action; which action
  comes next, and whether to pause for confirmation, is :mod:`flows.nodejobs.jobtype`'s pure decision.
* An action raising anything but a restart request or a store failure fails its task only.
* Diagnosis Tasks take turns: at most ``diagnosis.maxConcurrentTasks`` are walked at once, the others
  wait without holding their data (:class:`roles.edge.task_limits.Turns`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final, NoReturn, final

import anyio
import anyio.abc
import structlog

from flows.diagnosis import job as diagnosis_job
from flows.nodejobs.jobtype import EdgeJobType, NextStep, next_step, resume_at
from nodetask.clock import Clock
from nodetask.messages import Report, Upstream
from nodetask.route import Route
from roles.common.restart import RestartRequested
from roles.edge.context import Actions, Outcome, TaskContext
from roles.edge.outbox import Outbox
from roles.edge.settings import AgentSettings
from roles.edge.store.records import ActionProgress, NodeTask, TaskState
from roles.edge.store.store import EdgeStore, StoreError
from roles.edge.task_limits import Turns, diagnosis_turns

__all__ = ["TaskRunner"]

Log = structlog.typing.FilteringBoundLogger

DRAIN_BEFORE_RESTART_S: Final = 3.0
MAX_RAISED_REASON: Final = 500
PRUNE_PERIOD_S: Final = 3600.0
"""How often finished tasks past their retention are forgotten (``AgentSettings.task_retention``), or
four times per retention when that is shorter."""
"""Characters of an unexpected exception kept in the failure it becomes (its text may echo any input)."""
_FINISHED: Final = NextStep(None)
CANCELLED: Final = "cancelled: the job was deleted or interrupted in the cloud"


@dataclass(slots=True)
class _Walk:
    """One task being walked: its attempt, the scope that stops it, and when it ended."""

    attempt: int
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    ended: anyio.Event = field(default_factory=anyio.Event)
    why: str = CANCELLED
    """What its failure says when it is cancelled."""


@final
class TaskRunner:
    """Walks the node tasks; :meth:`run` owns their task group, :meth:`start` and :meth:`cancel` steer them."""

    def __init__(
        self,
        *,
        settings: AgentSettings,
        store: EdgeStore,
        actions: Actions,
        job_types: Mapping[str, EdgeJobType],
        clock: Clock,
        outbox: Outbox,
        wait_connected: Callable[[float], Awaitable[bool]],
        send_now: Callable[[Upstream], Awaitable[None]],
        log: Log,
        ended: Callable[[str], object] = lambda job_uid: None,
        read_node: Callable[[], Awaitable[Mapping[str, Any] | None]] | None = None,
    ) -> None:
        """``ended`` is called with a task's job UID once the task has ended (not when it pauses for a
        confirmation, stalls on its store or is left for a restart); ``read_node`` reads the device's own
        Node from its cache, for actions that judge the kubelet."""
        self._settings = settings
        self._store = store
        self._actions = actions
        self._types = job_types
        self._clock = clock
        self._outbox = outbox
        self._wait_connected = wait_connected
        self._send_now = send_now
        self._log = log
        self._ended = ended
        self._read_node = read_node
        self._work: anyio.abc.TaskGroup | None = None
        self._running: dict[str, _Walk] = {}
        self._turns: Mapping[str, Turns] = {
            diagnosis_job.RESOURCE_TYPE: diagnosis_turns(settings.max_concurrent_tasks),
        }

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Resume the stored running tasks, then keep walking the started ones until cancelled."""
        async with anyio.create_task_group() as work:
            self._work = work
            for task in await self._store.tasks(TaskState.RUNNING):
                self._log.info("task_resumed", job=task.route, action=task.current_action, attempt=task.attempt)
                self.start(task.job_uid, task.attempt)
            task_status.started()
            await anyio.sleep_forever()

    async def prune(self) -> NoReturn:
        """From the start and every :data:`PRUNE_PERIOD_S`, forget the finished tasks past their retention.

        Without it a device that runs a diagnosis a minute would keep every one it ever ran, until its
        store's size limit refused the next task and the cache's writes with it.
        """
        retention = timedelta(seconds=self._settings.task_retention)
        period = min(PRUNE_PERIOD_S, self._settings.task_retention / 4)
        while True:
            try:
                pruned = await self._store.prune_finished(self._clock.now() - retention)
            except StoreError as exc:
                self._log.warning("finished_tasks_not_pruned", error=str(exc))
            else:
                if pruned:
                    self._log.info("finished_tasks_pruned", tasks=pruned)
            await anyio.sleep(period)

    def running(self, job_uid: str) -> bool:
        """Whether this task is being walked now."""
        return job_uid in self._running

    def start(self, job_uid: str, attempt: int) -> None:
        """Walk the stored task ``job_uid`` (at ``attempt``) from where it stands, unless it is being walked already."""
        assert self._work is not None, "start() before run() is ready"
        if job_uid not in self._running:
            walk = self._running[job_uid] = _Walk(attempt)
            self._work.start_soon(self._walk, job_uid, walk, name=f"task {job_uid}")

    def cancel(self, job_uid: str, attempt: int = 0) -> None:
        """Stop walking ``job_uid`` at ``attempt`` (0: any); the cancellation is recorded as its failure."""
        walk = self._running.get(job_uid)
        if walk is not None and attempt in (0, walk.attempt):
            self._log.info("task_cancelled", uid=job_uid, attempt=walk.attempt)
            walk.scope.cancel()

    async def end_before(self, job_uid: str, attempt: int) -> None:
        """Stop walking any attempt of ``job_uid`` before ``attempt`` (a retry came), and wait until it has ended."""
        walk = self._running.get(job_uid)
        if walk is None or walk.attempt >= attempt:
            return
        self._log.info("task_superseded", uid=job_uid, attempt=walk.attempt, by=attempt)
        walk.why = f"cancelled: attempt {attempt} of the job replaced attempt {walk.attempt}"
        walk.scope.cancel()
        await walk.ended.wait()

    async def confirm(self, job_uid: str, attempt: int = 0) -> bool:
        """Release a task waiting for confirmation (at ``attempt``; 0: whichever); it resumes with the action
        after its confirmation point."""
        task = await self._store.get_task(job_uid)
        if task is None or task.state is not TaskState.WAITING_CONFIRMATION or attempt not in (0, task.attempt):
            return False
        # A paused task's current action is already the one after the confirmation point.
        await self._store.set_task_state(job_uid, state=TaskState.RUNNING, current_action=task.current_action)
        self._log.info("task_confirmed", job=task.route, attempt=task.attempt)
        self.start(job_uid, task.attempt)
        return True

    async def report_failure(self, route: Route, job_uid: str, action: str, reason: str, attempt: int = 0) -> None:
        """Send a failure report outside the outbox (``seq`` 0, nothing to acknowledge): best effort.

        For when the store itself is what fails; the task stays where its last recorded result left
        it and resumes from there once the store works again.
        """
        report = Report(
            route=route,
            job_uid=job_uid,
            seq=0,
            action=action,
            succ=False,
            finish_time=self._clock.stamp(),
            reason=reason,
            attempt=attempt,
        )
        await self._send_now(report)

    async def _walk(self, job_uid: str, walk: _Walk) -> None:
        scope = walk.scope
        ended = False
        try:
            with scope:
                try:
                    ended = await self._walk_task(job_uid)
                except RestartRequested:
                    # Let the hub have the reports already recorded before the agent goes away,
                    # so that progress shows up now rather than after the restart.
                    await self._outbox.drain(DRAIN_BEFORE_RESTART_S)
                    raise
            if scope.cancelled_caught:
                task = await self._store.get_task(job_uid)
                if task is not None and task.attempt == walk.attempt and task.state is not TaskState.FINISHED:
                    await self._record(task, task.current_action, Outcome(False, walk.why))
                ended = True
            if ended:
                self._ended(job_uid)
        except StoreError as exc:
            # The store could not record a result; the task resumes from its last record next start.
            self._log.error("task_stalled", uid=job_uid, error=str(exc))
        finally:
            del self._running[job_uid]
            walk.ended.set()

    def _context(self, task: NodeTask, spec: object) -> TaskContext:
        settings = self._settings
        return TaskContext(
            task=task,
            spec=spec,
            node=settings.node,
            version=settings.version,
            data_dir=settings.data_dir,
            thresholds=settings.thresholds,
            store=self._store,
            config_file=settings.config_file,
            health_deadline=settings.health_deadline,
            wait_connected=self._wait_connected,
            read_node=self._read_node,
        )

    async def _walk_task(self, job_uid: str) -> bool:
        """Walk the task, in its turn if its job type takes turns, until it ends (True) or pauses for a
        confirmation (False)."""
        task = await self._store.get_task(job_uid)
        if task is None:
            return True
        turns = self._turns.get(task.job_type)
        patience = turns.patience(task.spec) if turns is not None else None
        if turns is None or patience is None:
            return await self._walk_from(task)
        # Waiting, a task holds none of its data: however many wait, they cost the device next to nothing.
        del task
        with anyio.move_on_after(patience) as waiting:
            await turns.acquire()
        if waiting.cancelled_caught:
            missed = await self._store.get_task(job_uid)
            if missed is not None:
                self._log.warning("task_missed_its_turn", job=missed.route, waited_s=patience, turns=turns.limit)
                await self._record(missed, missed.current_action, Outcome(False, turns.missed(patience)))
            return True
        try:
            task = await self._store.get_task(job_uid)
            return True if task is None else await self._walk_from(task)
        finally:
            turns.release()

    async def _walk_from(self, task: NodeTask) -> bool:
        """Walk ``task`` from its first unrecorded action: :meth:`_walk_task` without the turn."""
        log = self._log.bind(job=task.route, attempt=task.attempt)
        jt = self._types.get(task.job_type)
        if jt is None:
            await self._record(task, task.current_action, Outcome(False, f"unknown job type {task.job_type}"))
            return True
        spec, problem = jt.read_spec(task.spec)
        done = {p.action: p.succ for p in await self._store.progress(task.job_uid)}
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
                try:
                    outcome = await action_fn(self._context(task, spec))
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
                return False
            action = step.action
        return True

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
            # A success may say something too (a rollback: what it undid and why); a failure always does.
            reason=outcome.reason if outcome.succ else outcome.reason or f"action {action} failed",
            extend=outcome.extend,
        )
        # Shielded: a Cancel arriving mid-write must not leave a result unreported.
        with anyio.CancelScope(shield=True):
            try:
                await self._store.record_result(
                    progress, state=state, current_action=after or action, attempt=task.attempt
                )
                jt = self._types.get(task.job_type)
                if state is TaskState.FINISHED and jt is not None and jt.exclusive:
                    await self._store.end_exclusive(task.job_uid)
            except StoreError as exc:
                await self._report_unrecorded(task, action, exc)
                raise
        self._outbox.grew()

    async def _report_unrecorded(self, task: NodeTask, action: str, error: StoreError) -> None:
        """The store cannot take a result (disk full, read-only): tell the hub, as a failure."""
        self._log.error("result_not_recorded", job=task.route, action=action, error=str(error))
        reason = f"the edge cannot record the result of {action}: {error}"
        await self.report_failure(Route.parse(task.route), task.job_uid, action, reason, task.attempt)


def _propagates(exc: Exception) -> bool:
    """Whether an action's exception is the agent's to handle (a restart, a store that fails), not a fault."""
    wanted = (RestartRequested, StoreError)
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(wanted) is not None
    return isinstance(exc, wanted)
