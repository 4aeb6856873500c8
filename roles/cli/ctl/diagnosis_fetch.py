"""What ``ctl get|describe diagnosis`` read, through the project's Kube client."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flows.diagnosis.tasks import DIAGNOSIS_UID_LABEL
from roles.cli.ctl.diagnosis_views import (
    DiagnosisSummary,
    PathRow,
    TaskRow,
    path_rows,
    summarize_diagnosis,
    task_counts,
    task_rows,
)
from roles.cli.ctl.fetch import EVENTS_SHOWN, CtlError, objects_list
from roles.cli.ctl.views import EventRow, event_rows
from roles.kube import Kube, NotFound
from roles.kube.resources import DIAGNOSES, EVENTS, OPERATION_SETS, TASKS
from schemas.diagnosis.v1 import Diagnosis, OperationSet

__all__ = [
    "DescribedDiagnosis",
    "describe_diagnosis",
    "diagnoses",
    "diagnosis_events_selector",
    "diagnosis_objects",
    "find_diagnosis",
]


async def diagnoses(kube: Kube, *, namespace: str, selector: str = "") -> list[DiagnosisSummary]:
    """The Diagnoses of ``namespace`` (empty: of every namespace) whose labels match ``selector``, by
    namespace and name."""
    listed, _, _ = await kube.list(DIAGNOSES, namespace=namespace, label_selector=selector)
    ordered = sorted(listed, key=lambda d: (d.metadata.namespace, d.metadata.name))
    return [summarize_diagnosis(d) for d in ordered]


async def diagnosis_objects(
    kube: Kube, *, namespace: str, selector: str = "", managed_fields: bool = False
) -> dict[str, Any]:
    """The Diagnoses as the API server has them, in one ``List`` (``kubectl get diagnosis -o json``)."""
    return await objects_list(kube, [DIAGNOSES], selector=selector, managed_fields=managed_fields, namespace=namespace)


async def find_diagnosis(kube: Kube, name: str, *, namespace: str) -> Diagnosis:
    """The Diagnosis ``name`` of ``namespace``; :class:`CtlError` naming both when there is none."""
    try:
        return await kube.get(DIAGNOSES, name, namespace=namespace)
    except NotFound:
        raise CtlError(f"no Diagnosis {name!r} in namespace {namespace!r} (give -n NAMESPACE)") from None


def diagnosis_events_selector(name: str) -> str:
    """The field selector of the Events about Diagnosis ``name`` (recorded in its namespace)."""
    return f"involvedObject.kind=Diagnosis,involvedObject.name={name}"


@dataclass(frozen=True, slots=True)
class DescribedDiagnosis:
    diagnosis: DiagnosisSummary
    paths: list[PathRow]
    counts: dict[str, int]
    tasks: list[TaskRow]
    """The failed and timed-out Tasks, each with its reason."""
    events: list[EventRow]


async def describe_diagnosis(kube: Kube, name: str, *, namespace: str) -> DescribedDiagnosis:
    """The Diagnosis, the outcome of each path of its OperationSet, its Tasks per phase with the failed ones,
    and its latest Events."""
    diagnosis = await find_diagnosis(kube, name, namespace=namespace)
    operation_set: OperationSet | None
    try:
        operation_set = await kube.get(OPERATION_SETS, diagnosis.spec.operation_set)
    except NotFound:
        operation_set = None  # deleted since: the status still records the paths tried
    selector = f"{DIAGNOSIS_UID_LABEL}={diagnosis.metadata.uid}"
    tasks, _, _ = await kube.list(TASKS, namespace=namespace, label_selector=selector)
    events, _, _ = await kube.list(EVENTS, namespace=namespace, field_selector=diagnosis_events_selector(name))
    return DescribedDiagnosis(
        diagnosis=summarize_diagnosis(diagnosis),
        paths=path_rows(diagnosis, operation_set),
        counts=task_counts(tasks),
        tasks=task_rows(tasks, failed_only=True),
        events=event_rows(events, limit=EVENTS_SHOWN),
    )
