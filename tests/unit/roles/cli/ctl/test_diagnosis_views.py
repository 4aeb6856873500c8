"""What ``nodetaskd ctl`` shows of a Diagnosis comes from its objects through pure functions."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from types import MappingProxyType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from roles.cli.ctl.diagnosis_text import describe_diagnosis_text, diagnoses_table, diagnosis_line, diagnosis_names
from roles.cli.ctl.diagnosis_views import (
    TASK_PHASES,
    is_diagnosis_kind,
    path_rows,
    summarize_diagnosis,
    task_counts,
    task_rows,
)
from roles.cli.ctl.diagnosis_watch import DiagnosisLines, Followed, followed, settled
from roles.cli.ctl.views import EventRow
from schemas.diagnosis.v1 import (
    AdjacencyNode,
    Checkpoint,
    Condition,
    Diagnosis,
    DiagnosisPhase,
    DiagnosisSpec,
    DiagnosisStatus,
    OperationSet,
    OperationSetSpec,
    OperationSetStatus,
    PodReference,
    Task,
    TaskPhase,
    TaskSpec,
    TaskStatus,
)
from schemas.meta import ConditionStatus, ObjectMeta

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
COLLECT = AdjacencyNode(id=1, to=(2, 3), operation="collect")
CHECK = AdjacencyNode(id=2, operation="check")
OTHER = AdjacencyNode(id=3, operation="other")
PATHS = ((COLLECT, CHECK), (COLLECT, OTHER))
OPSET = OperationSet(
    metadata=ObjectMeta(name="net"),
    spec=OperationSetSpec(adjacency_list=(AdjacencyNode(to=(1,)), COLLECT, CHECK, OTHER)),
    status=OperationSetStatus(paths=PATHS, ready=True),
)


def _diagnosis(
    phase: DiagnosisPhase,
    *,
    failed: tuple[tuple[AdjacencyNode, ...], ...] = (),
    succeeded: tuple[AdjacencyNode, ...] = (),
    checkpoint: Checkpoint | None = None,
    conditions: tuple[Condition, ...] = (),
) -> Diagnosis:
    status = DiagnosisStatus(
        phase=phase,
        failed_paths=failed,
        succeeded_path=succeeded,
        checkpoint=checkpoint,
        node_names=("edge-1", "edge-2"),
        conditions=conditions,
    )
    meta = ObjectMeta(name="why", namespace="ops", creation_timestamp="2026-11-29T11:58:00Z")
    return Diagnosis(metadata=meta, spec=DiagnosisSpec(operation_set="net"), status=status)


def _task(node: str, operation: str, phase: TaskPhase, *conditions: Condition, pod: str = "") -> Task:
    spec = TaskSpec(
        operation=operation, node_name=node, pod_reference=PodReference(namespace="ops", name=pod) if pod else None
    )
    return Task(
        metadata=ObjectMeta(name=f"t-{node}-{operation}"),
        spec=spec,
        status=TaskStatus(phase=phase, conditions=conditions),
    )


def _condition(kind: str, reason: str, message: str = "", at: str = "2026-11-29T11:59:00Z") -> Condition:
    return Condition(type=kind, status=ConditionStatus.TRUE, reason=reason, message=message, last_transition_time=at)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("diagnosis", True),
        ("Diagnoses", True),
        ("diag", True),
        ("diagnoses.diagnosis.kubediag.org", True),
        ("task", False),
        ("nodeupgradejob", False),
    ],
)
def test_the_diagnosis_kind_is_named_as_kubectl_names_it(text: str, named: bool) -> None:
    """Its plural, singular, short name and full resource name name it, in any case; other kinds do not."""
    assert is_diagnosis_kind(text) is named


def test_a_running_diagnosis_says_its_path_stage_and_the_stages_tasks_one_based() -> None:
    """The checkpoint's 0-based path and stage read 1-based, with the stage's counts; none once it ended."""
    running = _diagnosis(
        DiagnosisPhase.RUNNING, checkpoint=Checkpoint(path_index=1, node_index=0, desired=2, active=1, succeeded=1)
    )
    summary = summarize_diagnosis(running)
    assert (summary.path, summary.stage, summary.nodes) == (2, 1, 2)
    assert summary.stage_tasks == {"desired": 2, "active": 1, "succeeded": 1, "failed": 0}
    assert not summary.final
    ended = summarize_diagnosis(_diagnosis(DiagnosisPhase.SUCCEEDED, checkpoint=Checkpoint(path_index=1)))
    assert (ended.path, ended.stage, ended.stage_tasks, ended.final) == (None, None, {}, True)


def test_the_reason_is_the_latest_condition_whatever_its_place_in_the_list() -> None:
    """Conditions keep their place when they change again, so the latest by transition time gives the reason."""
    conditions = (
        _condition("Complete", "AllPathsFailed", "every path failed", at="2026-11-29T11:59:30Z"),
        _condition("Accepted", "TargetsResolved", at="2026-11-29T11:58:01Z"),
    )
    summary = summarize_diagnosis(_diagnosis(DiagnosisPhase.FAILED, conditions=conditions))
    assert summary.reason == "AllPathsFailed: every path failed"


def test_paths_read_failed_succeeded_running_or_untried_from_the_operation_set() -> None:
    """Every path of the OperationSet appears once, in order, with its outcome; the current one runs."""
    running = _diagnosis(DiagnosisPhase.RUNNING, failed=(PATHS[0],), checkpoint=Checkpoint(path_index=1))
    assert [(p.index, p.operations, p.outcome) for p in path_rows(running, OPSET)] == [
        (1, ["collect", "check"], "Failed"),
        (2, ["collect", "other"], "Running"),
    ]
    done = _diagnosis(DiagnosisPhase.SUCCEEDED, failed=(PATHS[0],), succeeded=PATHS[1])
    assert [p.outcome for p in path_rows(done, OPSET)] == ["Failed", "Succeeded"]
    pending = _diagnosis(DiagnosisPhase.PENDING)
    assert [p.outcome for p in path_rows(pending, OPSET)] == ["-", "-"]


def test_without_its_operation_set_the_paths_come_from_the_status() -> None:
    """An OperationSet deleted since still leaves the paths tried, as the Diagnosis recorded them."""
    done = _diagnosis(DiagnosisPhase.SUCCEEDED, failed=(PATHS[0],), succeeded=PATHS[1])
    assert [(p.operations, p.outcome) for p in path_rows(done, None)] == [
        (["collect", "check"], "Failed"),
        (["collect", "other"], "Succeeded"),
    ]


def test_failed_tasks_carry_the_reason_of_their_failed_condition_and_the_pod_they_were_for() -> None:
    """Only Failed and Unknown Tasks are rows when asked for those; the reason is the Failed condition's."""
    tasks = [
        _task(
            "edge-2",
            "check",
            TaskPhase.FAILED,
            _condition("Accepted", "TaskAccepted"),
            _condition("Failed", "ProcessorFailed", "exit 3"),
        ),
        _task("edge-1", "check", TaskPhase.SUCCEEDED, _condition("Complete", "Succeeded")),
        _task("edge-3", "check", TaskPhase.UNKNOWN, _condition("Failed", "TimedOut", "no answer in 30s"), pod="web-0"),
        _task("edge-4", "collect", TaskPhase.NONE),
    ]
    rows = task_rows(tasks, failed_only=True)
    assert [(r.target, r.phase, r.reason) for r in rows] == [
        ("edge-2", "Failed", "ProcessorFailed: exit 3"),
        ("edge-3 ops/web-0", "Unknown", "TimedOut: no answer in 30s"),
    ]
    assert task_counts(tasks) == {"Pending": 1, "Running": 0, "Succeeded": 1, "Failed": 1, "Unknown": 1}
    assert len(task_rows(tasks)) == 4


@given(st.lists(st.sampled_from(list(TaskPhase)), max_size=20))
def test_task_counts_add_up_to_the_tasks(phases: list[TaskPhase]) -> None:
    """Every Task is counted once, under one of the five phases."""
    counts = task_counts([_task(f"n{i}", "op", phase) for i, phase in enumerate(phases)])
    assert tuple(counts) == TASK_PHASES
    assert sum(counts.values()) == len(phases)


def test_the_table_names_the_namespace_only_across_namespaces_and_wide_adds_the_reason() -> None:
    """``-A`` adds NAMESPACE first, ``-o wide`` adds FAILED-PATHS and REASON; a stage says its ended Tasks."""
    running = summarize_diagnosis(
        _diagnosis(DiagnosisPhase.RUNNING, checkpoint=Checkpoint(node_index=1, desired=2, succeeded=1, failed=1))
    )
    plain = diagnoses_table([running], now=NOW, namespaces=False).splitlines()
    assert plain[0].split() == ["NAME", "PHASE", "OPERATIONSET", "NODES", "PATH", "STAGE", "AGE"]
    assert plain[1].split() == ["why", "Running", "net", "2", "1", "2", "(2/2", "tasks", "ended)", "2m"]
    every = diagnoses_table([running], now=NOW, namespaces=True, wide=True).splitlines()
    assert every[0].split()[0] == "NAMESPACE"
    assert every[0].split()[-2:] == ["FAILED-PATHS", "REASON"]
    assert every[1].startswith("ops ")
    assert diagnosis_names([running]) == "diagnosis.diagnosis.kubediag.org/why\n"


def test_describe_shows_paths_task_counts_failed_tasks_with_reasons_and_events() -> None:
    """A failed run's description names its reason, each path's outcome and each failed node's reason."""
    diagnosis = _diagnosis(
        DiagnosisPhase.FAILED, failed=PATHS, conditions=(_condition("Complete", "AllPathsFailed", "2 paths failed"),)
    )
    tasks = [_task("edge-2", "check", TaskPhase.FAILED, _condition("Failed", "ProcessorFailed", "exit 3"))]
    event = EventRow(time="2026-11-29T11:59:30Z", type="Warning", reason="DiagnosisFailed", message="2 paths failed")
    text = describe_diagnosis_text(
        summarize_diagnosis(diagnosis),
        path_rows(diagnosis, OPSET),
        task_counts(tasks),
        task_rows(tasks, failed_only=True),
        [event],
        now=NOW,
    )
    assert "Reason:        AllPathsFailed: 2 paths failed" in text
    assert "Tasks:         Pending 0, Running 0, Succeeded 0, Failed 1, Unknown 0" in text
    lines = text.splitlines()
    assert ["1", "Failed", "collect", "->", "check"] in [line.split() for line in lines]
    assert ["edge-2", "check", "Failed", "ProcessorFailed:", "exit", "3"] in [line.split() for line in lines]
    assert any("DiagnosisFailed" in line for line in lines[lines.index("Events:") :])


def test_a_watch_reports_visible_changes_only_and_ends_0_only_if_every_diagnosis_succeeded() -> None:
    """A new resourceVersion alone is no change; the watch ends once all are final, 1 for a failure or deletion."""
    running = summarize_diagnosis(_diagnosis(DiagnosisPhase.RUNNING, checkpoint=Checkpoint(desired=2)))
    state = Followed(diagnoses=MappingProxyType({}))
    state, changed = followed(state, running.ref, running)
    assert changed
    assert settled(state) is None
    state, changed = followed(state, running.ref, running)
    assert not changed
    succeeded = summarize_diagnosis(_diagnosis(DiagnosisPhase.SUCCEEDED))
    state, changed = followed(state, running.ref, succeeded)
    assert changed
    assert settled(state) == 0
    other = Followed(diagnoses=MappingProxyType({"diagnosis/a": succeeded}))
    other, _ = followed(other, "diagnosis/b", None)
    assert settled(other) == 1
    failed = summarize_diagnosis(_diagnosis(DiagnosisPhase.FAILED))
    assert settled(Followed(diagnoses=MappingProxyType({"diagnosis/a": succeeded, "diagnosis/c": failed}))) == 1


def test_watch_lines_say_the_phase_path_stage_and_counts_in_one_line_or_json() -> None:
    """A plain line per change carries phase, path and stage; -o json writes an object per change."""
    running = summarize_diagnosis(
        _diagnosis(DiagnosisPhase.RUNNING, checkpoint=Checkpoint(path_index=0, node_index=1, desired=2, active=2))
    )
    assert diagnosis_line(running, when="T") == (
        "T diagnosis/why phase=Running nodes=2 path=1 stage=2 desired=2 active=2 succeeded=0 failed=0"
    )
    out = io.StringIO()
    DiagnosisLines(out, json=True, clock=lambda: "T").diagnosis(running.ref, None)
    assert out.getvalue() == '{"time":"T","deleted":"diagnosis/why"}\n'
