"""What the operator's CLI shows of Diagnoses, computed from API objects: pure functions over immutable data.

A Diagnosis becomes a :class:`DiagnosisSummary` (phase, where the run is, why it ended), the paths of its
OperationSet :class:`PathRow` s (which failed, which succeeded, which runs), its Tasks :class:`TaskRow` s (each
failed one with its reason). ``roles.cli.ctl.diagnosis_fetch`` only fetches.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Final

from roles.cli.ctl.views import Row
from schemas.diagnosis.kinds import DIAGNOSIS
from schemas.diagnosis.v1 import (
    AdjacencyNode,
    Condition,
    Diagnosis,
    DiagnosisPhase,
    OperationSet,
    Path,
    Task,
    TaskPhase,
)

__all__ = [
    "DIAGNOSIS_FINAL",
    "TASK_PHASES",
    "DiagnosisSummary",
    "PathRow",
    "TaskRow",
    "is_diagnosis_kind",
    "path_rows",
    "summarize_diagnosis",
    "task_counts",
    "task_rows",
]

DIAGNOSIS_FINAL: Final = frozenset({DiagnosisPhase.SUCCEEDED.value, DiagnosisPhase.FAILED.value})
TASK_PHASES: Final = ("Pending", "Running", "Succeeded", "Failed", "Unknown")
"""A Task's phases, in the order a Task goes through them (a Task without a phase counts as Pending)."""
FAILED_TASK_PHASES: Final = frozenset({TaskPhase.FAILED, TaskPhase.UNKNOWN})
_NAMES: Final = frozenset(
    {
        DIAGNOSIS.plural,
        DIAGNOSIS.singular,
        *DIAGNOSIS.short_names,
        f"{DIAGNOSIS.plural}.{DIAGNOSIS.group}",
        f"{DIAGNOSIS.singular}.{DIAGNOSIS.group}",
    }
)


def is_diagnosis_kind(text: str) -> bool:
    """Whether ``text`` names the Diagnosis kind as kubectl takes it: ``diagnosis``, ``diagnoses``, ``diag``..."""
    return text.lower() in _NAMES


class DiagnosisSummary(Row, frozen=True):
    namespace: str
    name: str
    phase: str
    operation_set: str
    nodes: int
    """Target nodes resolved (``status.nodeNames``); 0 until the controller has resolved them."""
    path: int | None = None
    """The path the run is on (1-based), None once ended or before it starts."""
    stage: int | None = None
    """The stage of that path (1-based)."""
    stage_tasks: dict[str, int] = {}
    """The current stage's Tasks: ``desired``, ``active``, ``succeeded``, ``failed``."""
    failed_paths: int = 0
    reason: str = ""
    """Why the run is where it is: its latest condition's reason and message."""
    created: str = ""

    @property
    def ref(self) -> str:
        return f"{DIAGNOSIS.singular}/{self.name}"

    @property
    def final(self) -> bool:
        return self.phase in DIAGNOSIS_FINAL


class PathRow(Row, frozen=True):
    index: int
    """1-based, in the order the controller tries the paths."""
    operations: list[str]
    outcome: str
    """``Failed``, ``Succeeded``, ``Running`` (the current one), or ``-`` (not tried)."""


class TaskRow(Row, frozen=True):
    name: str
    target: str
    """The node, and the pod (``namespace/name``) when the Task is for one."""
    operation: str
    phase: str
    reason: str = ""


def _latest(conditions: Sequence[Condition]) -> Condition | None:
    """The condition that changed last (the later one of the list on a tie, as conditions are appended)."""
    latest: Condition | None = None
    for condition in conditions:
        if latest is None or condition.last_transition_time >= latest.last_transition_time:
            latest = condition
    return latest


def _said(condition: Condition | None) -> str:
    if condition is None:
        return ""
    return ": ".join(part for part in (condition.reason, condition.message) if part)


def summarize_diagnosis(diagnosis: Diagnosis) -> DiagnosisSummary:
    """A Diagnosis as a summary: where its run is (path and stage, 1-based, while it runs) and why."""
    status = diagnosis.status
    checkpoint = status.checkpoint
    running = status.phase is DiagnosisPhase.RUNNING and checkpoint is not None
    return DiagnosisSummary(
        namespace=diagnosis.metadata.namespace,
        name=diagnosis.metadata.name,
        phase=str(status.phase),
        operation_set=diagnosis.spec.operation_set,
        nodes=len(status.node_names),
        path=checkpoint.path_index + 1 if running and checkpoint else None,
        stage=checkpoint.node_index + 1 if running and checkpoint else None,
        stage_tasks=(
            {
                "desired": checkpoint.desired,
                "active": checkpoint.active,
                "succeeded": checkpoint.succeeded,
                "failed": checkpoint.failed,
            }
            if running and checkpoint
            else {}
        ),
        failed_paths=len(status.failed_paths),
        reason=_said(_latest(status.conditions)),
        created=diagnosis.metadata.creation_timestamp,
    )


def _operations(path: Path) -> list[str]:
    return [node.operation for node in path]


def _ids(path: Iterable[AdjacencyNode]) -> tuple[int | None, ...]:
    return tuple(node.id for node in path)


def path_rows(diagnosis: Diagnosis, operation_set: OperationSet | None) -> list[PathRow]:
    """The paths of the run: every path of ``operation_set`` with its outcome so far; without the
    OperationSet (deleted), the paths the Diagnosis's status records."""
    status = diagnosis.status
    failed = {_ids(p) for p in status.failed_paths}
    succeeded = _ids(status.succeeded_path) if status.succeeded_path else None
    current = status.checkpoint.path_index if status.checkpoint is not None else None
    running = status.phase is DiagnosisPhase.RUNNING
    if operation_set is None or not operation_set.status.paths:
        recorded = [*status.failed_paths, *((status.succeeded_path,) if status.succeeded_path else ())]
        return [
            PathRow(index=i + 1, operations=_operations(p), outcome="Failed" if _ids(p) in failed else "Succeeded")
            for i, p in enumerate(recorded)
        ]
    rows = []
    for index, path in enumerate(operation_set.status.paths):
        ids = _ids(path)
        if ids == succeeded:
            outcome = "Succeeded"
        elif ids in failed:
            outcome = "Failed"
        elif running and index == current:
            outcome = "Running"
        else:
            outcome = "-"
        rows.append(PathRow(index=index + 1, operations=_operations(path), outcome=outcome))
    return rows


def _task_reason(task: Task) -> str:
    """Why a Task failed (its Failed condition), or what its latest condition says."""
    failed = next((c for c in task.status.conditions if c.type == "Failed"), None)
    return _said(failed if failed is not None else _latest(task.status.conditions))


def task_rows(tasks: Iterable[Task], *, failed_only: bool = False) -> list[TaskRow]:
    """A row per Task (only the Failed and Unknown ones when ``failed_only``), by operation then target."""
    rows = []
    for task in tasks:
        if failed_only and task.status.phase not in FAILED_TASK_PHASES:
            continue
        pod = task.spec.pod_reference
        target = task.spec.node_name + (f" {pod.namespace}/{pod.name}" if pod is not None else "")
        rows.append(
            TaskRow(
                name=task.metadata.name,
                target=target,
                operation=task.spec.operation,
                phase=str(task.status.phase) or "Pending",
                reason=_task_reason(task) if task.status.phase in FAILED_TASK_PHASES else "",
            )
        )
    return sorted(rows, key=lambda r: (r.operation, r.target, r.name))


def task_counts(tasks: Iterable[Task]) -> dict[str, int]:
    """Tasks per phase, by :data:`TASK_PHASES`."""
    counted = Counter(str(t.status.phase) or "Pending" for t in tasks)
    return {phase: counted.get(phase, 0) for phase in TASK_PHASES}
