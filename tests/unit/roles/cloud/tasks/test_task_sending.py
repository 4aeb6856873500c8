"""A hub's diagnosis Tasks sent to their nodes over memory links: the request, acks, start time, failures before
sending, sending again on each session, and Cancel."""

from __future__ import annotations

import anyio
import msgspec
import trio.testing

from flows.diagnosis.job import MAX_REQUEST_BYTES, TaskRun
from nodetask.messages import Ack, Cancel, Error, ReportAck, RunAction
from roles.kube.resources import DIAGNOSES, OPERATIONS, TASKS
from schemas.diagnosis.v1 import (
    API_VERSION,
    Diagnosis,
    DiagnosisSpec,
    Task,
    TaskPhase,
    TaskSpec,
    TaskStatus,
)
from schemas.meta import ObjectMeta, OwnerReference
from tests.unit.roles.cloud.doubles import running_hub
from tests.unit.roles.cloud.tasks.world import (
    NS,
    PROCESSOR,
    conditions,
    connected,
    operation,
    quiet,
    result,
    stored,
    task,
    world,
)


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
