"""Reports from edges, written into their job's status and answered only once the write landed.

A report reaches a hub over an edge's session (:meth:`Reports.answer`) or KubeEdge's HTTP endpoint
(:mod:`roles.cloud.transport.kubeedge_http`); both go through :meth:`Reports.record`, which hands the pure
change :func:`~flows.nodejobs.changes.record` to the job's status writer. The edge forgets a report
only when told so: a ReportAck (written now or before), or an Error it drops the report on
(:data:`REPORT_REJECTED`: it can never apply; :data:`JOB_GONE`: the job no longer exists).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import structlog
import trio

from flows.nodejobs.changes import RecordOutcome, record
from flows.nodejobs.jobtype import JobType
from nodetask import messages
from nodetask.clock import Clock
from nodetask.messages import Error, Report, ReportAck
from roles.cloud.jobs.watch import Jobs
from roles.cloud.metrics import HubMetrics
from roles.cloud.settings import HubSettings
from roles.kube import ApiError, NotFound
from roles.kube.retrying import Outage

__all__ = ["JOB_GONE", "REPORT_REJECTED", "Reports"]

Log = structlog.typing.FilteringBoundLogger

# Error codes a hub answers reports with; an edge drops a report answered with either.
REPORT_REJECTED: Final = "report_rejected"
JOB_GONE: Final = "job_gone"


class Reports:
    """Applies reported results to the jobs in the hub's cache."""

    def __init__(
        self,
        *,
        jobs: Jobs,
        types: Mapping[str, JobType],
        clock: Clock,
        settings: HubSettings,
        metrics: HubMetrics,
    ) -> None:
        self._jobs = jobs
        self._types = dict(types)
        self._clock = clock
        self._settings = settings
        self._metrics = metrics
        self._rejected = metrics.rejected.labels(reason=REPORT_REJECTED)

    async def answer(self, report: Report, log: Log) -> ReportAck | Error:
        """Record ``report`` (from its own node's session); the answer the edge gets once it is written."""
        started = trio.current_time()  # anyio's costs a backend lookup, on every report
        log = log.bind(job=report.route.job, action=report.action, seq=report.seq)
        ref = str(report.seq)
        jt = self._types.get(report.route.job_type)
        if jt is None:
            return Error(code=REPORT_REJECTED, message=f"unknown job type {report.route.job_type}", ref=ref)
        outcome = await self.record(
            jt, report.route.job, report.route.node, report.result, uid=report.job_uid, attempt=report.attempt, log=log
        )
        if outcome is None:
            return Error(code=JOB_GONE, message=f"job {report.route.job} no longer exists", ref=ref)
        if outcome.acknowledge:
            self._metrics.report_latency.observe(trio.current_time() - started)
            return ReportAck(job_uid=report.job_uid, seq=report.seq)
        self._rejected.inc()
        log.warning("report_rejected", error=outcome.error)
        return Error(code=REPORT_REJECTED, message=outcome.error, ref=ref)

    async def record(
        self, jt: JobType, job: str, node: str, result: messages.ActionResult, *, uid: str, log: Log, attempt: int = 0
    ) -> RecordOutcome | None:
        """Write ``result`` of the node's ``attempt`` (0: its current one) into job ``job``'s status; None if
        the job is gone.

        API errors other than NotFound are retried with backoff for as long as the caller waits:
        a report is either written or still held by the edge, never lost in between.
        """
        if not self._jobs.synced.is_set():  # waiting on a set event would still yield once, on every report
            await self._jobs.synced.wait()
        outage: Outage | None = None  # made only when a write fails, not on every report
        while True:
            state = self._jobs.get(jt, job)
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
                        compact_above=self._settings.compact_status_above,
                        attempt=attempt,
                    )
                )
            except NotFound:
                log.warning("report_for_missing_job")
                return None
            except ApiError as exc:
                outage = outage or Outage(log, "report_write_retry")
                await outage.wait(exc)
                continue
            if outage is not None:
                outage.recovered()
            if outcome.applied:
                log.info("report_applied")
            elif outcome.other_attempt:
                log.info("report_of_another_attempt", attempt=attempt, current=outcome.other_attempt)
            return outcome
