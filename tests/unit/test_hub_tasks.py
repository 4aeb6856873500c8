"""A hub's diagnosis Tasks over memory links and an in-memory API server: dispatch, acks, results, their races."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import msgspec
import pytest
import trio.testing

from flows.diagnosis.job import MAX_REQUEST_BYTES, RUN, TaskRun
from nodetask.messages import Ack, Cancel, Error, Report, ReportAck, RunAction
from nodetask.route import Route
from roles.kube import ApiError, Resource
from roles.kube.resources import DIAGNOSES, OPERATIONS, TASKS
from schemas.diagnosis.v1 import (
    API_VERSION,
    Diagnosis,
    DiagnosisSpec,
    Operation,
    OperationSpec,
    Task,
    TaskPhase,
    TaskSpec,
    TaskStatus,
)
from schemas.meta import ObjectMeta, OwnerReference
from schemas.processors import HTTPServer, Processor
from tests.unit.hub_doubles import FakeEdge, MemoryApi, MemoryDoor, edge_nodes, running_hub

T = TypeVar("T", bound=msgspec.Struct)
NS = "ns"
PROCESSOR = Processor(http_server=HTTPServer(address="127.0.0.1", port=9, path="/check"), timeout_seconds=5)


def operation(name: str = "check") -> Operation:
    return Operation(metadata=ObjectMeta(name=name), spec=OperationSpec(processor=PROCESSOR))


def task(name: str = "t", *, node: str = "n0", op: str = "check", phase: TaskPhase = TaskPhase.NONE) -> Task:
    return Task(
        metadata=ObjectMeta(name=name, namespace=NS, uid=f"uid-{name}"),
        spec=TaskSpec(operation=op, node_name=node, parameters={"target": "10.0.0.1"}),
        status=TaskStatus(phase=phase),
    )


def world(*tasks: Task, operations: tuple[str, ...] = ("check",), api: MemoryApi | None = None) -> MemoryApi:
    """An API server with nodes n0 and n1, the Operations and the Tasks."""
    api = api or MemoryApi()
    edge_nodes(api, "n0", "n1")
    for name in operations:
        api.put(OPERATIONS, operation(name))
    for t in tasks:
        api.put(TASKS, t)
    return api


def stored(api: MemoryApi, name: str = "t") -> Task:
    return api.peek(TASKS, name, NS)


def conditions(t: Task) -> list[tuple[str, str, str]]:
    return [(c.type, c.status, c.reason) for c in t.status.conditions]


def result(run: RunAction, *, seq: int = 1, succ: bool = True, extend: str = "", reason: str = "") -> Report:
    return Report(route=run.route, job_uid=run.job_uid, seq=seq, action=RUN, succ=succ, extend=extend, reason=reason)


async def connected(door: MemoryDoor, node: str = "n0") -> FakeEdge:
    edge = door.connect(node)
    await edge.hello()
    return edge


async def answer_to(edge: FakeEdge) -> ReportAck | Error:
    """The hub's next answer to a report; a RunAction on the way (the Task was just found) is skipped."""
    while True:
        msg = await edge.receive()
        if isinstance(msg, ReportAck | Error):
            return msg


async def quiet() -> None:
    """Every task of the hub (writers included) has nothing left to do."""
    await trio.testing.wait_all_tasks_blocked()


async def test_a_task_is_sent_to_its_connected_node_with_its_processor_and_request_then_gets_its_start_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The RunAction has the issue's route, the Task's uid, Run, the Operation's processor, the namespace and
    the request with ``task.uid``; once sent, the Task is Pending with a startTime; a Task of another node waits."""
    api = world(task("t"), task("other", node="n1"))
    async with running_hub(api) as (_, door):
        edge = await connected(door)
        run = await edge.next_of(RunAction)
        assert str(run.route) == "diagnosis.kubediag.org/v1/task/t/nodes/n0"
        assert (run.job_uid, run.action, run.id) == ("uid-t", "Run", "uid-t/1")
        assert msgspec.json.decode(run.spec, type=TaskRun) == TaskRun(
            namespace=NS,
            name="t",
            operation="check",
            processor=PROCESSOR,
            request={"target": "10.0.0.1", "task.uid": "uid-t"},
        )
        await quiet()
        assert stored(api).status.phase is TaskPhase.PENDING
        assert stored(api).status.start_time
        assert stored(api, "other").status == TaskStatus()
        assert await edge.frames_within(5) == []


async def test_the_nodes_ack_makes_the_task_running_with_accepted(autojump_clock: trio.testing.MockClock) -> None:
    """An Ack of the RunAction (the edge stored it) is written as Running with Accepted=True."""
    api = world(task())
    async with running_hub(api) as (_, door):
        edge = await connected(door)
        run = await edge.next_of(RunAction)
        await edge.send(Ack(id=run.id))
        await quiet()
        assert stored(api).status.phase is TaskPhase.RUNNING
        assert conditions(stored(api)) == [("Accepted", "True", "TaskStored")]


async def test_an_ack_is_written_even_when_the_session_ends_before_the_write(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The edge stored the Task, acked it and went away while the write waited in its coalescing window:
    Accepted is still written (it is still true)."""
    api = world(task())
    async with running_hub(api, coalesce_window=0.5) as (_, door):
        edge = await connected(door)
        run = await edge.next_of(RunAction)
        await edge.send(Ack(id=run.id))
        await edge.close()
        await anyio.sleep(1)
        await quiet()
        assert stored(api).status.phase is TaskPhase.RUNNING
        assert conditions(stored(api)) == [("Accepted", "True", "TaskStored")]


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


async def test_a_task_whose_operation_does_not_exist_fails_with_a_condition_naming_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """No RunAction; the Task is Failed with Failed and OperationNotFound conditions saying which Operation."""
    api = world(task(op="gone"))
    async with running_hub(api) as (_, door):
        edge = await connected(door)
        assert await edge.frames_within(5) == []
        failed = stored(api)
        assert failed.status.phase is TaskPhase.FAILED
        assert {(c.type, c.message) for c in failed.status.conditions} == {
            ("Failed", "Operation gone is not found"),
            ("OperationNotFound", "Operation gone is not found"),
        }


async def test_an_operation_the_watch_has_not_shown_yet_is_read_from_the_api_server(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A Task may come through its watch before its Operation does: the hub asks before failing it."""
    api = world(task(), operations=())
    api.put(OPERATIONS, operation(), tell=False)
    async with running_hub(api) as (_, door):
        edge = await connected(door)
        run = await edge.next_of(RunAction)
        assert msgspec.json.decode(run.spec, type=TaskRun).processor == PROCESSOR


def owned(name: str, diagnosis: Diagnosis, *, node: str = "n0", **parameters: str) -> Task:
    """A Task as the controller makes it now: owned by ``diagnosis``, with only its own keys."""
    meta = diagnosis.metadata
    owner = OwnerReference(api_version=API_VERSION, kind="Diagnosis", name=meta.name, uid=meta.uid, controller=True)
    return Task(
        metadata=ObjectMeta(name=name, namespace=NS, uid=f"uid-{name}", owner_references=(owner,)),
        spec=TaskSpec(operation="check", node_name=node, parameters={"node": node, **parameters}),
    )


def a_diagnosis(**parameters: str) -> Diagnosis:
    return Diagnosis(
        metadata=ObjectMeta(name="d", namespace=NS, uid="uid-d"),
        spec=DiagnosisSpec(operation_set="g", parameters=parameters),
    )


async def test_a_task_is_sent_with_its_diagnosis_parameters_read_once_for_all_its_tasks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Tasks that do not carry their Diagnosis's parameters get them in the request, the Task's own keys winning;
    the two Tasks of one Diagnosis cost one read of it, which decodes its parameters only."""
    d = a_diagnosis(target="10.0.0.1", mode="full")
    api = world(owned("t0", d, mode="quick"), owned("t1", d, node="n1"))
    api.put(DIAGNOSES, d)
    async with running_hub(api) as (_, door):
        first, second = await connected(door, "n0"), await connected(door, "n1")
        runs = [await first.next_of(RunAction), await second.next_of(RunAction)]
    requests = [msgspec.json.decode(run.spec, type=TaskRun).request for run in runs]
    assert requests == [
        {"target": "10.0.0.1", "mode": "quick", "node": "n0", "task.uid": "uid-t0"},
        {"target": "10.0.0.1", "mode": "full", "node": "n1", "task.uid": "uid-t1"},
    ]
    assert api.reads["diagnoses"] == 1


async def test_a_task_whose_diagnosis_is_gone_fails_instead_of_being_sent_without_its_parameters(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """No such Diagnosis (or another of the same name, with another uid): no RunAction, the Task is Failed with
    DiagnosisNotFound naming it."""
    other = msgspec.structs.replace(a_diagnosis(), metadata=ObjectMeta(name="d", namespace=NS, uid="uid-other"))
    for present in (None, other):
        api = world(owned("t", a_diagnosis()))
        if present is not None:
            api.put(DIAGNOSES, present)
        async with running_hub(api) as (_, door):
            edge = await connected(door)
            assert await edge.frames_within(5) == []
            failed = stored(api)
        assert failed.status.phase is TaskPhase.FAILED
        [condition] = failed.status.conditions
        assert (condition.reason, condition.message) == (
            "DiagnosisNotFound",
            "Diagnosis d (uid uid-d) is not found: its parameters cannot be read",
        )


async def test_request_data_too_large_for_a_node_fails_the_task_instead_of_being_sent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A RunAction an edge could not take is never sent: the Task fails with RequestTooLarge."""
    big = msgspec.structs.replace(
        task(), spec=TaskSpec(operation="check", node_name="n0", parameters={"x": "y" * MAX_REQUEST_BYTES})
    )
    api = world(big)
    async with running_hub(api) as (_, door):
        edge = await connected(door)
        assert await edge.frames_within(5) == []
        failed = stored(api)
        assert failed.status.phase is TaskPhase.FAILED
        assert failed.status.conditions[-1].reason == "RequestTooLarge"


async def test_a_task_is_sent_again_on_each_new_session_until_it_has_ended(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A session lost before the result: the RunAction again (new id, same uid) on the next; none once it ended."""
    api = world(task())
    async with running_hub(api) as (_, door):
        first = await connected(door)
        sent = await first.next_of(RunAction)
        await first.close()
        second = await connected(door)
        again = await second.next_of(RunAction)
        assert (again.route, again.job_uid, again.id) == (sent.route, sent.job_uid, "uid-t/2")
        await second.send(result(again))
        await second.next_of(ReportAck)
        await second.close()
        third = await connected(door)
        assert await third.frames_within(5) == []


async def test_a_restarted_hub_sends_a_running_task_again_without_writing_it_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A Task Running with Accepted when its hub went is sent again by the next hub; its status stays as it was."""
    api = world(task())
    async with running_hub(api) as (_, door):
        edge = await connected(door)
        run = await edge.next_of(RunAction)
        await edge.send(Ack(id=run.id))
        await quiet()
    before = stored(api)
    assert before.status.phase is TaskPhase.RUNNING
    async with running_hub(api) as (_, door):
        edge = await connected(door)
        again = await edge.next_of(RunAction)
        assert (again.route, again.job_uid) == (run.route, run.job_uid)
        await edge.send(Ack(id=again.id))
        await quiet()
        assert stored(api) == before


async def test_a_task_deleted_while_its_node_runs_it_is_cancelled_there_and_its_report_is_gone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Deleted: a Cancel for its route and uid; a report for it then gets job_gone, which the edge drops it on."""
    api = world(task())
    async with running_hub(api) as (_, door):
        edge = await connected(door)
        run = await edge.next_of(RunAction)
        await edge.send(Ack(id=run.id))
        await quiet()
        api.delete(TASKS, "t", NS)
        assert await edge.next_of(Cancel) == Cancel(route=run.route, job_uid="uid-t")
        await edge.send(result(run, succ=False, reason="cancelled"))
        answer = await edge.next_of(Error)
        assert (answer.code, answer.ref) == ("job_gone", "1")


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


class RefusesLargeResults(MemoryApi):
    """Answers a status write holding results over ``limit`` bytes as etcd does: request too large."""

    limit = 100

    async def update_status(
        self,
        resource: Resource[T],
        name: str,
        mutate: Callable[[T], T | None],
        *,
        current: T | None = None,
        namespace: str = "",
    ) -> T | None:
        def checked(obj: T) -> T | None:
            new: Any = mutate(obj)
            if new is not None and len(msgspec.json.encode(new.status.results)) > self.limit:
                raise ApiError(500, "InternalError", "etcdserver: request is too large")
            return new  # type: ignore[no-any-return]

        return await super().update_status(resource, name, checked, current=current, namespace=namespace)


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
