"""KubeEdge's HTTP report endpoint: ``POST /task/{taskType}/name/{job}/node/{node}/status``.

The body is KubeEdge's upstream message ``{action, succ, finishTime, reason, extend}``; the caller
authenticates as ``node`` with its bearer token. The answer ``ok`` comes only after the status
write, like a websocket ReportAck.
"""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from typing import Final

import structlog

from flows.nodejobs.jobtype import JobType
from nodetask import messages
from nodetask.messages import MessageError
from nodetask.names import clip, object_name_problem
from roles.cloud.jobs.reports import REPORT_REJECTED, Reports
from roles.cloud.metrics import HubMetrics
from roles.cloud.transport.auth import AuthError, TokenBook
from roles.common.health import HttpRoute, Request, Response

__all__ = ["LEGACY_TASK_TYPES", "TaskStatusEndpoint"]

Log = structlog.typing.FilteringBoundLogger

# KubeEdge's v1alpha1 task types, accepted by the HTTP endpoint as aliases.
LEGACY_TASK_TYPES: Final = {"upgrade": "nodeupgradejob", "prepull": "imageprepulljob"}


class TaskStatusEndpoint:
    """Takes reports over HTTP from nodes that prove who they are."""

    def __init__(
        self, *, types: Mapping[str, JobType], reports: Reports, tokens: TokenBook, metrics: HubMetrics, log: Log
    ) -> None:
        self._types = dict(types)
        self._reports = reports
        self._tokens = tokens
        self._metrics = metrics
        self._log = log

    def routes(self) -> tuple[HttpRoute, ...]:
        """The endpoint's one route (a prefix)."""
        return (HttpRoute("POST", "/task/", self._task_status, prefix=True),)

    async def _task_status(self, request: Request) -> Response:
        target = await self._task_target(request)
        if isinstance(target, Response):
            return target
        jt, job, node = target
        try:
            result = messages.decode_result(request.body)
        except MessageError as exc:
            self._metrics.rejected.labels(reason="malformed").inc()
            return Response.text(HTTPStatus.BAD_REQUEST, str(exc))
        log = self._log.bind(node=node, job=job, action=result.action, via="http")
        outcome = await self._reports.record(jt, job, node, result, uid="", log=log)
        if outcome is None:
            return Response.text(HTTPStatus.NOT_FOUND, f"job {job} not found")
        if not outcome.acknowledge:
            self._metrics.rejected.labels(reason=REPORT_REJECTED).inc()
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
                self._metrics.auth_failures.labels(status=str(int(HTTPStatus.BAD_REQUEST))).inc()
                return Response.text(HTTPStatus.BAD_REQUEST, f"{what} {clip(name)!r} {problem}")
        jt = self._types.get(LEGACY_TASK_TYPES.get(task_type, task_type))
        if jt is None:
            return Response.text(HTTPStatus.NOT_FOUND, f"unknown task type {clip(task_type, 64)!r}")
        scheme, _, token = (request.header("authorization") or "").partition(" ")
        try:
            await self._tokens.check(node, token.strip() if scheme.lower() == "bearer" else "")
        except AuthError as exc:
            self._metrics.auth_failures.labels(status=str(exc.status)).inc()
            return Response.text(exc.status, str(exc))
        return jt, job, node
