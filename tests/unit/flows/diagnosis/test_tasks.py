"""A Diagnosis's Tasks: names that are always the same and always valid, ownership, the Unknown verdict."""

from __future__ import annotations

from datetime import timedelta

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from flows.diagnosis.paths import Stage
from flows.diagnosis.pipeline import Pipeline, pipeline_of
from flows.diagnosis.tasks import DIAGNOSIS_UID_LABEL, TASK_FINALIZER, deadline, new_task, task_name, timed_out
from nodetask.clock import format_time
from nodetask.names import is_object_name
from schemas.diagnosis.v1 import Diagnosis, Task, TaskPhase, TaskSpec, TaskStatus
from schemas.meta import ObjectMeta
from tests.unit.flows.diagnosis.world import T0, UID, diagnosis, operation_set

LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", fullmatch=True)
SUBDOMAIN = st.lists(LABEL, min_size=1, max_size=8).map(".".join).filter(lambda s: len(s) <= 253)


def _named(name: str) -> Diagnosis:
    d = diagnosis(("a",))
    return msgspec.structs.replace(d, metadata=msgspec.structs.replace(d.metadata, name=name))


@given(SUBDOMAIN, SUBDOMAIN, SUBDOMAIN, st.integers(0, 127), st.integers(0, 255))
def test_task_names_are_valid_object_names_and_unique_per_stage_and_node(
    name: str, node: str, operation: str, path: int, depth: int
) -> None:
    """Whatever the lengths of the Diagnosis, node and Operation names, the name is a valid object name of at
    most 253 characters, the same on every call, and another node or stage gives another name."""
    stage = Stage(action="", node=1, operation=operation, depth=depth, first_path=path, last_path=path)
    d = _named(name)
    first = task_name(d, node, stage)
    assert is_object_name(first)
    assert first == task_name(d, node, stage)
    assert first != task_name(d, node + "x", stage)
    assert first != task_name(d, node, Stage("", 1, operation, depth + 1, path, path))


def test_a_short_name_is_kubediags() -> None:
    """``<diagnosis>.<uid[:8]>.<node>.<path>.<stage>.<operation>``."""
    stage = Stage(action="p2s1", node=4, operation="collect", depth=1, first_path=2, last_path=3)
    assert task_name(diagnosis(("a",)), "edge-1", stage) == "d.0123abcd.edge-1.2.1.collect"


def test_a_new_task_is_owned_by_its_diagnosis_and_kept_by_a_finalizer() -> None:
    """ownerReference (controller), the finalizer, the Diagnosis's uid as a label, its namespace."""
    pipeline = pipeline_of(operation_set([[1], []]))
    assert isinstance(pipeline, Pipeline)
    task = new_task(diagnosis(("a",)), pipeline.plan, path_index=0, node_index=0, node="a", pod=None)
    assert task.metadata.namespace == "ns"
    assert task.metadata.finalizers == (TASK_FINALIZER,)
    assert task.metadata.labels == {DIAGNOSIS_UID_LABEL: UID}
    (owner,) = task.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid, owner.controller) == ("Diagnosis", "d", UID, True)
    assert (task.spec.operation, task.spec.node_name) == ("op-1", "a")


PARAMETERS = st.dictionaries(st.text(min_size=1, max_size=20), st.text(max_size=4096), max_size=16)


@given(PARAMETERS)
def test_a_tasks_size_does_not_grow_with_its_diagnosis_parameters(parameters: dict[str, str]) -> None:
    """Whatever a Diagnosis's parameters, each of its Tasks is the same object as for a Diagnosis without any:
    they are read from the Diagnosis when the Task is sent, not copied into every Task of every stage."""
    pipeline = pipeline_of(operation_set([[1], []]))
    assert isinstance(pipeline, Pipeline)
    bare = new_task(diagnosis(("a",)), pipeline.plan, path_index=0, node_index=0, node="a", pod=None)
    task = new_task(
        diagnosis(("a",), parameters=parameters), pipeline.plan, path_index=0, node_index=0, node="a", pod=None
    )
    assert task == bare
    assert len(msgspec.json.encode(task)) < 1024
    assert set(task.spec.parameters) == {"task.name", "task.namespace", "node"}


def _task(phase: TaskPhase = TaskPhase.NONE, start: str = "") -> Task:
    meta = ObjectMeta(name="t", namespace="ns", creation_timestamp=format_time(T0))
    return Task(
        metadata=meta, spec=TaskSpec(operation="o", node_name="a"), status=TaskStatus(phase=phase, start_time=start)
    )


def test_the_deadline_counts_from_dispatch_else_creation_and_ends_with_the_task() -> None:
    """startTime (the hub's dispatch) when set, else creationTimestamp; an ended Task has none."""
    assert deadline(_task(), 30) == T0 + timedelta(seconds=30)
    assert deadline(_task(TaskPhase.RUNNING, "2026-01-01T00:01:00Z"), 30) == T0 + timedelta(seconds=90)
    for phase in (TaskPhase.SUCCEEDED, TaskPhase.FAILED, TaskPhase.UNKNOWN):
        assert deadline(_task(phase), 30) is None


def test_a_silent_task_is_unknown_only_once_past_its_deadline() -> None:
    """Before the deadline nothing changes; at it the Task is Unknown with a TimedOut condition; a Task
    that has a result meanwhile keeps it."""
    assert timed_out(_task(), timeout_seconds=30, now=T0 + timedelta(seconds=29)) is None
    expired = timed_out(_task(TaskPhase.RUNNING), timeout_seconds=30, now=T0 + timedelta(seconds=30))
    assert expired is not None
    assert expired.status.phase is TaskPhase.UNKNOWN
    (condition,) = expired.status.conditions
    assert (condition.type, condition.status, condition.reason) == ("Failed", "True", "TimedOut")
    assert "30 s" in condition.message
    assert timed_out(_task(TaskPhase.SUCCEEDED), timeout_seconds=30, now=T0 + timedelta(days=1)) is None
