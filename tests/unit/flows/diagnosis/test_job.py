"""A diagnosis Task as a job type: its route, what its RunAction carries, its results and its status changes."""

from __future__ import annotations

from datetime import timedelta

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flows.diagnosis import job as diagnosis_job
from flows.diagnosis.hub_task import Recorded, TaskChange, accepted, failed, finished, route_of, sent, task_run
from flows.diagnosis.job import MAX_RESULTS_BYTES, RUN, TaskRun, decode_results, encode_results
from flows.diagnosis.tasks import is_final
from flows.nodejobs.jobtype import ExtendError, next_step, resume_at
from nodetask import messages
from nodetask.messages import ActionResult
from nodetask.route import Route
from schemas.diagnosis.v1 import Task, TaskPhase, TaskSpec, TaskStatus
from schemas.meta import ObjectMeta
from schemas.processors import HTTPServer, Processor
from tests.unit.flows.diagnosis.world import T0

UID = "task-uid-1"
TEXT = st.text(max_size=40)
RESULTS = st.dictionaries(TEXT, TEXT, max_size=8)


def task(*, name: str = "d.0123abcd.edge-1.0.0.collect", phase: TaskPhase = TaskPhase.NONE, uid: str = UID) -> Task:
    return Task(
        metadata=ObjectMeta(name=name, namespace="ns", uid=uid),
        spec=TaskSpec(operation="collect", node_name="edge-1", parameters={"a": "b", "node": "edge-1"}),
        status=TaskStatus(phase=phase),
    )


def report(*, succ: bool, extend: str = "", reason: str = "") -> ActionResult:
    return ActionResult(action=RUN, succ=succ, extend=extend, reason=reason)


def test_a_task_route_is_the_issues_and_takes_a_name_of_253_characters() -> None:
    """``diagnosis.kubediag.org/v1/task/<task>/nodes/<node>``, parsed back as it was, for the longest Task name."""
    name = ".".join(["a" * 63] * 4)[:253].rstrip(".")
    assert len(name) == 253
    route = route_of(task(name=name))
    assert str(route) == f"diagnosis.kubediag.org/v1/task/{name}/nodes/edge-1"
    assert messages.parse_route(str(route)) == route == Route.parse(str(route))


def test_the_run_action_carries_the_processor_the_namespace_and_the_request_with_the_task_uid() -> None:
    """The request is spec.parameters plus ``task.uid``; the edge's job type decodes the same TaskRun back."""
    processor = Processor(http_server=HTTPServer(address="127.0.0.1", port=8080, path="/x"), timeout_seconds=5)
    raw = task_run(task(), processor)
    spec, problem = diagnosis_job.JOB_TYPE.read_spec(raw)
    assert problem == ""
    assert spec == TaskRun(
        namespace="ns",
        name="d.0123abcd.edge-1.0.0.collect",
        operation="collect",
        processor=processor,
        request={"a": "b", "node": "edge-1", "task.uid": UID},
    )


@given(RESULTS, RESULTS)
def test_a_task_gets_its_diagnosis_parameters_from_the_hub_as_one_carrying_them_did(
    diagnosis_parameters: dict[str, str], own: dict[str, str]
) -> None:
    """The request a node gets for a Task that does not carry its Diagnosis's parameters (the hub passes them) is
    the one it got for a Task an older controller made with them copied in, read either way; the Task's own keys
    (results, telemetry) win over the Diagnosis's."""
    processor = Processor(http_server=HTTPServer(address="127.0.0.1", port=8080, path="/x"), timeout_seconds=5)
    new = msgspec.structs.replace(task(), spec=TaskSpec(operation="collect", node_name="edge-1", parameters=own))
    old_spec = TaskSpec(operation="collect", node_name="edge-1", parameters={**diagnosis_parameters, **own})
    old = msgspec.structs.replace(task(), spec=old_spec)
    sent = task_run(new, processor, diagnosis_parameters)
    assert sent == task_run(old, processor, diagnosis_parameters) == task_run(old, processor)
    request = msgspec.json.decode(sent, type=TaskRun).request
    assert request == {**diagnosis_parameters, **own, "task.uid": UID}


def test_an_undecodable_task_spec_fails_the_task_with_the_reason() -> None:
    """A spec that is not a TaskRun gives no spec and a reason naming what is wrong."""
    spec, problem = diagnosis_job.JOB_TYPE.read_spec(b'{"namespace": 1}')
    assert spec is None
    assert problem.startswith("the task spec is invalid:")


def test_a_task_is_one_action_that_ends_it_and_never_pauses_or_takes_the_exclusive_slot() -> None:
    """Run is first and final whatever its result; a task recorded as run resumes nowhere."""
    jt = diagnosis_job.JOB_TYPE
    assert jt.flow.first == RUN
    assert not jt.exclusive
    for succ in (True, False):
        assert next_step(jt, None, RUN, succ).action is None
        assert resume_at(jt, RUN, {RUN: succ}) is None
    assert resume_at(jt, RUN, {}) == RUN


@given(RESULTS)
def test_results_round_trip_through_extend(results: dict[str, str]) -> None:
    """What a processor returned is what the hub reads from the report."""
    assert decode_results(encode_results(results)) == results


def test_results_over_the_bound_are_an_error_on_both_sides() -> None:
    """The edge refuses to report them as results; a hub refuses to read them as results."""
    big = {"k": "x" * MAX_RESULTS_BYTES}
    with pytest.raises(ExtendError, match="more than"):
        encode_results(big)
    with pytest.raises(ExtendError, match="more than"):
        decode_results(msgspec.json.encode(big).decode())


@pytest.mark.parametrize("extend", ['["a"]', '{"a": 1}', "not json", '{"a": {"b": "c"}}', "[" * 100 + "]" * 100])
def test_results_that_are_not_an_object_of_strings_are_an_error(extend: str) -> None:
    """Lists, numbers, nested objects, garbage and deep nesting are refused with a reason."""
    with pytest.raises(ExtendError):
        decode_results(extend)


@pytest.mark.parametrize("phase", list(TaskPhase))
def test_the_job_types_final_phases_are_the_controllers(phase: TaskPhase) -> None:
    """The changes treat as final exactly the phases the controller counts as ended."""
    outcome = sent(uid=UID, now=T0)(task(phase=phase))[1]
    assert (outcome is Recorded.FINAL) == is_final(phase)


def test_sent_then_ack_then_result_give_pending_running_and_succeeded_with_the_conditions() -> None:
    """startTime when sent, Running with Accepted at the ack, Succeeded with Complete and the results at the end."""
    t0 = task()
    t1, outcome = sent(uid=UID, now=T0)(t0)
    assert outcome is Recorded.APPLIED
    assert t1 is not None
    assert (t1.status.phase, t1.status.start_time) == (TaskPhase.PENDING, "2026-01-01T00:00:00Z")
    t2, _ = accepted(uid=UID, node="edge-1", now=T0 + timedelta(seconds=1))(t1)
    assert t2 is not None
    assert t2.status.phase is TaskPhase.RUNNING
    assert [(c.type, c.status) for c in t2.status.conditions] == [("Accepted", "True")]
    assert t2.status.start_time == t1.status.start_time
    t3, _ = finished(report(succ=True, extend='{"k": "v"}'), uid=UID, node="edge-1", now=T0)(t2)
    assert t3 is not None
    assert (t3.status.phase, t3.status.results) == (TaskPhase.SUCCEEDED, {"k": "v"})
    assert [(c.type, c.status) for c in t3.status.conditions] == [("Accepted", "True"), ("Complete", "True")]


def test_a_failed_result_fails_the_task_with_its_reason_and_accepted_is_set_if_the_ack_was_missed() -> None:
    """Failed with a Failed condition whose message is the edge's reason; the edge stored it, so Accepted too."""
    t, _ = finished(report(succ=False, reason="HTTP 500: disk full"), uid=UID, node="edge-1", now=T0)(task())
    assert t is not None
    assert t.status.phase is TaskPhase.FAILED
    assert [(c.type, c.reason, c.message) for c in t.status.conditions][1] == (
        "Failed",
        "ProcessorFailed",
        "HTTP 500: disk full",
    )
    assert t.status.conditions[0].type == "Accepted"


def test_unreadable_results_fail_the_task_instead_of_being_refused() -> None:
    """A success whose extend is not an object of strings is recorded as a failure saying so."""
    t, outcome = finished(report(succ=True, extend="[1]"), uid=UID, node="edge-1", now=T0)(task())
    assert outcome is Recorded.APPLIED
    assert t is not None
    assert t.status.phase is TaskPhase.FAILED
    assert t.status.conditions[-1].reason == "ResultsInvalid"


def test_a_missing_operation_fails_the_task_with_a_condition_naming_it() -> None:
    """Failed, with a Failed and an OperationNotFound condition whose message names the Operation."""
    change = failed(
        uid=UID,
        reason="OperationNotFound",
        message="Operation collect is not found",
        condition_type="OperationNotFound",
        now=T0,
    )
    t, _ = change(task())
    assert t is not None
    assert t.status.phase is TaskPhase.FAILED
    assert {(c.type, c.message) for c in t.status.conditions} == {
        ("Failed", "Operation collect is not found"),
        ("OperationNotFound", "Operation collect is not found"),
    }


CHANGES = st.sampled_from(
    [
        sent(uid=UID, now=T0),
        accepted(uid=UID, node="edge-1", now=T0),
        finished(report(succ=True, extend='{"k": "v"}'), uid=UID, node="edge-1", now=T0),
        finished(report(succ=False, reason="no"), uid=UID, node="edge-1", now=T0),
        failed(uid=UID, reason="X", message="x", now=T0),
    ]
)


@given(st.sampled_from([TaskPhase.SUCCEEDED, TaskPhase.FAILED, TaskPhase.UNKNOWN]), st.lists(CHANGES, max_size=6))
def test_no_change_moves_a_task_out_of_a_final_phase(phase: TaskPhase, changes: list[TaskChange]) -> None:
    """Whatever arrives after the Task ended (a late result after the controller's Unknown above all) writes nothing."""
    for change in changes:
        assert change(task(phase=phase)) == (None, Recorded.FINAL)


@given(st.lists(CHANGES, min_size=1, max_size=6))
def test_changes_are_idempotent_and_ignore_a_recreated_task(changes: list[TaskChange]) -> None:
    """Applying a change again to its own result writes nothing; a Task of another uid is never changed."""
    current = task()
    for change in changes:
        new, _ = change(current)
        if new is not None:
            current = new
            assert change(current)[0] is None
        assert change(task(uid="other")) == (None, Recorded.REPLACED)
