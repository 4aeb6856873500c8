"""The hub's jobs: a cache of every job from the watch, a status writer each, and runners for running ones.

Every job gets a :class:`~roles.cloud.jobs.status_writer.StatusWriter`; a job in Init or InProgress gets
a :class:`~roles.cloud.jobs.runner.JobRunner`, keyed by UID and run: a re-created (or retried) job's
runner starts only after the old one has unwound. The cache holds the newest copy of each job, from
the watch or from the answer to one of this hub's own writes, whichever is fresher.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import anyio
import anyio.abc
import structlog

from flows.nodejobs.changes import dispatchable
from flows.nodejobs.jobtype import JobType
from nodetask.clock import Clock
from roles.cloud.api import JobApi
from roles.cloud.jobs.runner import JobRunner, run_number
from roles.cloud.jobs.status_writer import StatusWriter
from roles.cloud.metrics import HubMetrics
from roles.cloud.sessions import SessionTable
from roles.cloud.settings import HubSettings
from roles.common.events import job_event, record_event
from roles.common.registry_auth import RegistryAuth
from roles.kube import ApiError, Deleted, Relisted, Upserted, WatchEvent
from roles.kube.errors import too_large
from roles.kube.following import follow
from roles.kube.resources import job_resource
from roles.kube.versions import newer
from schemas.access import counted

__all__ = ["EVENT_COMPONENT", "RUNNER_HISTORY", "JobState", "Jobs"]

Log = structlog.typing.FilteringBoundLogger
Key = tuple[str, str]
Credentials = Callable[[Any], Awaitable[tuple[dict[str, RegistryAuth], str]]]
"""A job's registry credentials per image, or why there are none (see :mod:`roles.cloud.jobs.image_secrets`)."""

EVENT_COMPONENT: Final = "nodetaskd-cloud"
"""The component named in the Events a hub records on jobs."""
RUNNER_HISTORY: Final = 256


@dataclass(slots=True)
class JobState:
    """One cached job: its newest copy, its status writer, and its runner while it runs."""

    job: Any
    writer: StatusWriter
    runner: JobRunner | None = None


def _newer(new: Any, old: Any) -> bool:
    # Not the same copy again: taking it would wake every waiter of the job's runner for nothing.
    return newer(new.metadata.resource_version, old.metadata.resource_version)


class Jobs:
    """Every job of every type this hub dispatches. Run :meth:`run`; ready once each type's watch has listed."""

    def __init__(
        self,
        api: JobApi,
        *,
        types: Mapping[str, JobType],
        sessions: SessionTable,
        credentials: Credentials,
        clock: Clock,
        settings: HubSettings,
        metrics: HubMetrics,
        log: Log,
    ) -> None:
        self._api = api
        self._types = dict(types)
        self._sessions = sessions
        self._credentials = credentials
        self._clock = clock
        self._settings = settings
        self._metrics = metrics
        self._log = log
        self._jobs: dict[Key, JobState] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._history: deque[JobRunner] = deque(maxlen=RUNNER_HISTORY)
        self.synced = anyio.Event()
        """Set once every type's first list has been taken in (its jobs cached, their runners started)."""

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Follow every job type's watch, with the writers and runners it needs, until cancelled."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            for jt in self._types.values():
                await follow(tg, functools.partial(self._api.watch, job_resource(jt.kind)), self._on_event(jt))
            self.synced.set()
            task_status.started()

    def get(self, jt: JobType, name: str) -> JobState | None:
        """The cached job ``name`` of type ``jt``, if there is one."""
        return self._jobs.get((jt.kind.plural, name))

    def offer(self, node: str) -> None:
        """A node's session came up: each running job's runner starts its task if it needs one."""
        for state in list(self._jobs.values()):
            if state.runner is not None:
                state.runner.offer(node)

    def runners(self) -> list[JobRunner]:
        """The runners this hub started, oldest first, current or ended (the last RUNNER_HISTORY)."""
        return list(self._history)

    def _on_event(self, jt: JobType) -> Callable[[WatchEvent], Awaitable[None]]:
        plural = jt.kind.plural

        async def take(event: WatchEvent) -> None:
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
                    pass

        return take

    async def _upsert(self, jt: JobType, job: Any) -> None:
        assert self._tg is not None
        key = (jt.kind.plural, job.metadata.name)
        state = self._jobs.get(key)
        if state is None:
            writer = StatusWriter(
                self._api,
                job_resource(jt.kind),
                job.metadata.name,
                window=self._settings.coalesce_window,
                log=self._log.bind(job=job.metadata.name),
                on_written=self._on_written(jt),
                cached=self._cached(jt.kind.plural, job.metadata.name),
                finish=counted,
                on_too_large=self._on_too_large(jt, job.metadata.name),
                on_failed=self._on_failed,
            )
            self._tg.start_soon(writer.run)
            state = self._jobs[key] = JobState(job=job, writer=writer)
        elif state.job.metadata.uid == job.metadata.uid and not _newer(job, state.job):
            return
        state.job = job
        runner = state.runner
        if runner is not None and (runner.uid != job.metadata.uid or runner.run_number != run_number(job)):
            # A re-created job, or a retried one whose finished run this hub never saw end: start afresh.
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
                sessions=self._sessions,
                writer=state.writer,
                clock=self._clock,
                log=self._log,
                on_dispatch=self._metrics.dispatch_latency.observe,
                credentials=credentials,
                credentials_error=credentials_error,
            )
            state.runner = runner
            self._history.append(runner)
            await self._tg.start(runner.run)

    async def _stop_runner(self, state: JobState) -> None:
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

    def _on_written(self, jt: JobType) -> Callable[[Any], None]:
        def written(job: Any) -> None:
            self._metrics.status_batches.inc()
            state = self._jobs.get((jt.kind.plural, job.metadata.name))
            if state is not None and state.job.metadata.uid == job.metadata.uid and _newer(job, state.job):
                state.job = job
                if state.runner is not None:
                    state.runner.update(job)

        return written

    def _cached(self, plural: str, name: str) -> Callable[[], Any]:
        def newest() -> Any:
            state = self._jobs.get((plural, name))
            return None if state is None else state.job

        return newest

    def _on_too_large(self, jt: JobType, name: str) -> Callable[[ApiError], Awaitable[None]]:
        async def tell(error: ApiError) -> None:
            state = self._jobs.get((jt.kind.plural, name))
            if state is None:
                return
            limit = self._settings.compact_status_above
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
                instance=self._settings.hub_id,
            )
            with anyio.move_on_after(10):
                await record_event(self._api, event, self._log.bind(job=name))

        return tell

    def _on_failed(self, error: ApiError) -> None:
        self._metrics.status_failures.labels(too_large="true" if too_large(error) else "false").inc()
