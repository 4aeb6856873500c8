"""A hub's diagnosis Task results: acknowledged only once written, the controller's Unknown winning, reports
the watch has not shown yet, refused reports, and results too large for the API server."""

from __future__ import annotations

import anyio
import msgspec
import pytest
import trio.testing

from flows.diagnosis.job import RUN
from nodetask.messages import Ack, Cancel, Error, Report, ReportAck, RunAction
from nodetask.route import Route
from roles.kube.resources import TASKS
from schemas.diagnosis.v1 import (
    API_VERSION,
    TaskPhase,
    TaskStatus,
)
from tests.unit.roles.cloud.doubles import running_hub
from tests.unit.roles.cloud.tasks.doubles import RefusesLargeResults
from tests.unit.roles.cloud.tasks.world import (
    answer_to,
    conditions,
    connected,
    quiet,
    result,
    stored,
    task,
    world,
)


async def test_a_result_is_acknowledged_only_after_its_write_and_makes_the_task_succeeded_with_its_results(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """While the write is held the edge hears nothing; then Succeeded, Complete, the results, and the ReportAck."""
    api = world(task())
    async with running_hub(api) as (_, door):
        edge = await connected(door)
        run = await edge.next_of(RunAction)
        await edge.send(Ack(id=run.id))
        await quiet()
        api.hold_status = anyio.Event()
        await edge.send(result(run, extend='{"open": "yes"}'))
        assert await edge.frames_within(20) == []
        assert stored(api).status.phase is TaskPhase.RUNNING
        api.hold_status.set()
        assert await edge.next_of(ReportAck) == ReportAck(job_uid="uid-t", seq=1)
        done = stored(api)
        assert (done.status.phase, done.status.results) == (TaskPhase.SUCCEEDED, {"open": "yes"})
        assert conditions(done) == [("Accepted", "True", "TaskStored"), ("Complete", "True", "TaskSucceeded")]


async def test_a_failed_result_fails_the_task_with_the_nodes_reason(autojump_clock: trio.testing.MockClock) -> None:
    """Failed, with a Failed condition whose message is what the edge said."""
    api = world(task())
    async with running_hub(api) as (_, door):
        edge = await connected(door)
        run = await edge.next_of(RunAction)
        await edge.send(result(run, succ=False, reason="HTTP 500 from 127.0.0.1:9/check: disk full"))
        assert await edge.next_of(ReportAck) == ReportAck(job_uid="uid-t", seq=1)
        failed = stored(api)
        assert failed.status.phase is TaskPhase.FAILED
        assert failed.status.conditions[-1].message == "HTTP 500 from 127.0.0.1:9/check: disk full"


async def test_a_result_after_the_controllers_unknown_is_acknowledged_and_changes_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The controller declared the Task Unknown: its node gets a Cancel, and its late result is acknowledged
    (so the edge forgets it) without a write: Unknown stays."""
    api = world(task())
    async with running_hub(api) as (_, door):
        edge = await connected(door)
        run = await edge.next_of(RunAction)
        await quiet()
        api.put(TASKS, msgspec.structs.replace(stored(api), status=TaskStatus(phase=TaskPhase.UNKNOWN)))
        assert await edge.next_of(Cancel) == Cancel(route=run.route, job_uid="uid-t")
        writes = api.status_writes
        await edge.send(result(run, extend='{"open": "yes"}'))
        assert await edge.next_of(ReportAck) == ReportAck(job_uid="uid-t", seq=1)
        assert (api.status_writes, stored(api).status.phase) == (writes, TaskPhase.UNKNOWN)


async def test_an_unknown_written_while_the_results_write_waits_wins_and_the_result_is_dropped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The controller's Unknown lands first: the hub's write conflicts, is decided again on the fresh copy,
    writes nothing, and the report is acknowledged; a final phase is never overwritten."""
    api = world(task())
    async with running_hub(api) as (_, door):
        edge = await connected(door)
        run = await edge.next_of(RunAction)
        await quiet()
        api.hold_status = anyio.Event()
        await edge.send(result(run, extend='{"open": "yes"}'))
        await quiet()
        api.put(TASKS, msgspec.structs.replace(stored(api), status=TaskStatus(phase=TaskPhase.UNKNOWN)))
        api.hold_status.set()
        assert await edge.next_of(ReportAck) == ReportAck(job_uid="uid-t", seq=1)
        assert stored(api).status == TaskStatus(phase=TaskPhase.UNKNOWN)


async def test_a_report_the_watch_has_not_shown_yet_is_found_through_the_api_server(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Another hub sent the Task and this hub's watch lags: the Task is found by its name and uid, and written;
    a report of a uid the API server does not have either is job_gone."""
    api = world()
    async with running_hub(api) as (_, door):
        edge = await connected(door)
        api.put(TASKS, task(node="n0"), tell=False)
        route = Route(API_VERSION, "task", "t", "n0")
        await edge.send(Report(route=route, job_uid="uid-t", seq=4, action=RUN, succ=True, extend='{"k": "v"}'))
        assert await answer_to(edge) == ReportAck(job_uid="uid-t", seq=4)
        assert stored(api).status.results == {"k": "v"}
        await edge.send(Report(route=route, job_uid="uid-none", seq=5, action=RUN, succ=True))
        answer = await answer_to(edge)
        assert isinstance(answer, Error)
        assert answer.code == "job_gone"


@pytest.mark.parametrize(
    ("route", "action"),
    [(Route(API_VERSION, "task", "t", "n0"), "Pull"), (Route(API_VERSION, "task", "other-name", "n0"), RUN)],
)
async def test_a_report_of_another_action_or_task_name_is_refused(
    autojump_clock: trio.testing.MockClock, route: Route, action: str
) -> None:
    """A Task has one action, and its uid one name: anything else is report_rejected, and nothing is written."""
    api = world(task())
    async with running_hub(api) as (_, door):
        edge = await connected(door)
        await edge.next_of(RunAction)
        await quiet()
        before = stored(api)
        await edge.send(Report(route=route, job_uid="uid-t", seq=1, action=action, succ=True))
        assert (await edge.next_of(Error)).code == "report_rejected"
        assert stored(api) == before


async def test_results_the_api_server_refuses_as_too_large_fail_the_task_saying_so(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The report is not left on the edge for ever: the Task fails with ResultsTooLarge and the report is acked."""
    api = world(task(), api=RefusesLargeResults())
    async with running_hub(api) as (_, door):
        edge = await connected(door)
        run = await edge.next_of(RunAction)
        await edge.send(result(run, extend=msgspec.json.encode({"k": "x" * 200}).decode()))
        assert await edge.next_of(ReportAck) == ReportAck(job_uid="uid-t", seq=1)
        failed = stored(api)
        assert failed.status.phase is TaskPhase.FAILED
        assert failed.status.conditions[-1].reason == "ResultsTooLarge"
        assert "request is too large" in failed.status.conditions[-1].message
