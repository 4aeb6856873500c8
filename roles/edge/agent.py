"""The edge agent: one connection to a hub at a time, node tasks walked locally, every result durable.

* A RunAction is stored before it is acknowledged; a task re-delivered with the same job UID is
  never run again - its latest recorded result is re-sent instead, so a restarted hub catches up.
* Each action's result and its report are written in one store transaction; reports leave the
  outbox in ``seq`` order and only when the hub acknowledges them (or refuses them for good), so
  an agent restart or an outage loses nothing: the outbox is flushed first on every connection.
* Tasks interrupted by an agent restart resume at their first unrecorded action.
* The connection loop tries the hub URLs in turn with capped, jittered backoff; three silent
  heartbeat intervals count as a dead session.

This module answers the hub's messages; the parts live beside it: the connection and its one
writer per session (:mod:`roles.edge.session`), the outbox (:mod:`roles.edge.outbox`), the task
walk (:mod:`roles.edge.walk`) and the local control socket (:mod:`roles.edge.control`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Final, final

import anyio
import anyio.abc
import structlog

from flows.jobtype import JobType
from nodetask.clock import Clock
from nodetask.link import OpenLink
from nodetask.messages import (
    PING_CAPABILITY,
    TYPED_CREDENTIALS,
    Ack,
    Cancel,
    Confirm,
    Downstream,
    Error,
    RegistryAuth,
    ReportAck,
    RunAction,
)
from roles.edge.context import Actions
from roles.edge.control import serve_control
from roles.edge.outbox import Outbox
from roles.edge.session import HubConnection, Session
from roles.edge.settings import AgentSettings
from roles.edge.store import EdgeStore, StoreError
from roles.edge.walk import TaskRunner
from roles.edge.ws_link import open_ws_link
from roles.registry_auth import credentials_of

__all__ = ["EdgeAgent"]

Log = structlog.typing.FilteringBoundLogger

FINAL_ERRORS: Final = frozenset({"report_rejected", "job_gone"})
"""Error codes by which a hub refuses a report for good: the edge drops it."""


@final
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
        open_link: OpenLink = open_ws_link,
    ) -> None:
        self.settings = settings
        self._store = store
        self._log = log.bind(node=settings.node)
        self._credentials: dict[str, tuple[Mapping[str, RegistryAuth], str]] = {}
        self._outbox = Outbox(store)
        self._hub = HubConnection(
            settings=settings,
            open_link=open_link,
            capabilities=tuple(
                sorted({f"{jt}/{action}" for jt, action in actions} | {TYPED_CREDENTIALS, PING_CAPABILITY})
            ),
            outbox=self._outbox,
            dispatch=self._dispatch,
            log=self._log,
        )
        self._tasks = TaskRunner(
            settings=settings,
            store=store,
            actions=actions,
            job_types=job_types,
            clock=clock,
            outbox=self._outbox,
            wait_connected=self._hub.wait_connected,
            send_now=self._hub.send_now,
            log=self._log,
        )

    @property
    def connected(self) -> anyio.Event:
        """Set while a hub session is up."""
        return self._hub.connected

    @property
    def connects(self) -> int:
        """Hub sessions established since the agent started."""
        return self._hub.connects

    async def wait_connected(self, within: float) -> bool:
        """Whether a hub session is (or becomes, within ``within`` seconds) established."""
        return await self._hub.wait_connected(within)

    def credentials(self, job_uid: str) -> tuple[Mapping[str, RegistryAuth], str]:
        """Registry credentials the hub sent with this job's RunAction, and its reason when it sent none.

        Kept in memory only: never written to disk. After an agent restart the hub re-sends them
        with the RunAction that resynchronises the task, before a resumed pull needs them.
        """
        return self._credentials.get(job_uid, ({}, ""))

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Resume stored tasks, then keep a hub connection until cancelled."""
        async with anyio.create_task_group() as work:
            await work.start(self._tasks.run)
            control = functools.partial(
                serve_control, self.settings.data_dir, store=self._store, confirm=self.confirm, log=self._log
            )
            await work.start(control)
            task_status.started()
            await self._hub.run()

    async def confirm(self, job_uid: str) -> bool:
        """Release a task waiting for confirmation; it resumes with the action after its confirmation point."""
        return await self._tasks.confirm(job_uid)

    async def _dispatch(self, msg: Downstream, session: Session) -> None:
        match msg:
            case RunAction():
                await self._on_run_action(msg, session)
            case ReportAck(seq=seq):
                await self._outbox.acknowledge(seq)
            case Error(code=code, ref=ref, message=text) if code in FINAL_ERRORS and ref.isdigit():
                self._log.warning("report_refused", seq=int(ref), code=code, error=text)
                await self._outbox.drop(int(ref), f"{code}: {text}")
            case Error(code=code, message=text):
                self._log.warning("hub_error", code=code, error=text)
            case Confirm(job_uid=uid):
                await self.confirm(uid)
            case Cancel(job_uid=uid):
                self._tasks.cancel(uid)
            case _:
                pass

    async def _on_run_action(self, run: RunAction, session: Session) -> None:
        if run.registry_credentials or run.credentials or run.credentials_error:
            self._credentials[run.job_uid] = credentials_of(run)
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
            reason = f"the edge cannot store the task: {exc}"
            await self._tasks.report_failure(run.route, run.job_uid, run.action, reason)
            return
        await session.send(Ack(id=run.id))
        if new:
            self._log.info("task_received", job=str(run.route), action=run.action)
            self._tasks.start(task.job_uid)
        elif not self._tasks.running(task.job_uid):
            await self._outbox.resend_latest(task)
