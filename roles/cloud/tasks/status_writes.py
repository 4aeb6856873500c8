"""The hub's writes of its diagnosis Tasks' status: one coalescing status writer per Task that has not ended.

Each write is a pure change of a Task (:mod:`flows.diagnosis.hub_task`: sent, accepted, finished, failed)
handed to the Task's :class:`~roles.cloud.jobs.status_writer.StatusWriter`, which writes it with those
submitted beside it. No write moves a Task out of a final phase. API errors are retried with backoff
(:class:`~roles.kube.retrying.Outage`) until the change is written or the Task ends; a reported result
the API server refuses as too large is written as a failure saying so.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.abc
import structlog

from flows.diagnosis import hub_task
from flows.diagnosis.hub_task import Recorded, TaskChange, failed, finished
from nodetask.clock import Clock
from nodetask.messages import Report
from roles.cloud.api import TaskApi
from roles.cloud.jobs.status_writer import StatusWriter
from roles.cloud.settings import HubSettings
from roles.cloud.tasks.state import TaskState
from roles.kube import ApiError, NotFound
from roles.kube.errors import too_large
from roles.kube.resources import TASKS
from roles.kube.retrying import Outage
from schemas.diagnosis.v1 import Task

__all__ = ["TaskStatusWrites"]

Log = structlog.typing.FilteringBoundLogger


class TaskStatusWrites:
    """Writes the Tasks' status changes; ``on_written`` gets each Task as a write left it.

    Its writers run in :attr:`tg`, the Tasks' task group, set once that runs.
    """

    def __init__(
        self, api: TaskApi, *, settings: HubSettings, clock: Clock, log: Log, on_written: Callable[[Task], None]
    ) -> None:
        self._api = api
        self._settings = settings
        self._clock = clock
        self._log = log
        self._on_written = on_written
        self.tg: anyio.abc.TaskGroup | None = None

    def _writer(self, state: TaskState) -> StatusWriter | None:
        """The Task's status writer, started on first use; None once the Task has ended or is gone."""
        if state.writer is None and not (state.final or state.gone):
            assert self.tg is not None
            meta = state.task.metadata
            state.writer = StatusWriter(
                self._api,
                TASKS,
                meta.name,
                namespace=meta.namespace,
                window=self._settings.coalesce_window,
                log=self._log.bind(task=f"{meta.namespace}/{meta.name}"),
                on_written=self._on_written,
                cached=lambda: state.task,
            )
            self.tg.start_soon(state.writer.run)
        return state.writer

    async def write(self, state: TaskState, change: TaskChange) -> Recorded | None:
        """Apply ``change`` to the Task's status; its outcome, or None when the Task is gone.

        Errors: the :class:`ApiError` of a write that failed (not NotFound).
        """
        # A change already true of the cached copy is true of any fresher one (they only move forward).
        new, outcome = change(state.task)
        if new is None and outcome in (Recorded.UNCHANGED, Recorded.FINAL):
            return outcome
        writer = self._writer(state)
        if writer is None:
            return None if state.gone else Recorded.FINAL
        try:
            result: Recorded = await writer.submit(change)
        except NotFound:
            return None
        except anyio.ClosedResourceError:
            # The Task ended or went while this change waited for its turn.
            return None if state.gone else Recorded.FINAL
        return result

    async def write_retrying(self, state: TaskState, change: TaskChange, log: Log) -> Recorded | None:
        """:meth:`write`, retried with backoff after API errors until it is written or the Task ends."""
        outage = Outage(log, "task_status_write_retry")
        while True:
            try:
                written = await self.write(state, change)
            except ApiError as exc:
                await outage.wait(exc)
                continue
            outage.recovered()
            return written

    async def write_result(self, state: TaskState, report: Report, log: Log) -> Recorded | None:
        """Write the result ``report`` carries, retried like :meth:`write_retrying`; None when the Task is gone.

        Results the API server refuses as too large are written as a failure saying so: refused, the
        report would wait on the edge for ever.
        """
        node = report.route.node
        change = finished(report.result, uid=report.job_uid, node=node, now=self._clock.now())
        outage = Outage(log, "report_write_retry")
        while True:
            try:
                outcome = await self.write(state, change)
            except ApiError as exc:
                if too_large(exc):
                    log.warning("task_results_too_large", error=str(exc))
                    message = f"the API server refused the results of node {node} as too large: {exc.message}"
                    change = failed(
                        uid=report.job_uid,
                        reason=hub_task.RESULTS_TOO_LARGE,
                        message=message,
                        now=self._clock.now(),
                    )
                else:
                    await outage.wait(exc)
                continue
            outage.recovered()
            return outcome
