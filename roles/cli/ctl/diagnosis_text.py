"""Plain-text output of ``ctl`` for Diagnoses: the ``get`` table, ``describe``, and ``watch``'s lines."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from roles.cli.ctl.diagnosis_views import TASK_PHASES, DiagnosisSummary, PathRow, TaskRow
from roles.cli.ctl.text import cut, events_table, table
from roles.cli.ctl.views import EventRow, age
from schemas.diagnosis.kinds import DIAGNOSIS

__all__ = ["describe_diagnosis_text", "diagnoses_table", "diagnosis_line", "diagnosis_names"]


def _stage(d: DiagnosisSummary) -> str:
    if d.stage is None:
        return "-"
    done = d.stage_tasks.get("succeeded", 0) + d.stage_tasks.get("failed", 0)
    return f"{d.stage} ({done}/{d.stage_tasks.get('desired', 0)} tasks ended)"


def diagnoses_table(
    rows: Sequence[DiagnosisSummary], *, now: datetime, headers: bool = True, wide: bool = False, namespaces: bool
) -> str:
    """One row a Diagnosis (with its namespace first when ``namespaces``, as ``kubectl get -A``); ``wide``
    adds the failed paths and the reason of its phase."""
    cells = [
        [
            *((d.namespace,) if namespaces else ()),
            d.name,
            d.phase or "(new)",
            d.operation_set,
            str(d.nodes),
            str(d.path) if d.path is not None else "-",
            _stage(d),
            age(d.created, now),
            *((str(d.failed_paths), cut(d.reason) or "-") if wide else ()),
        ]
        for d in rows
    ]
    head = (
        *(("NAMESPACE",) if namespaces else ()),
        "NAME",
        "PHASE",
        "OPERATIONSET",
        "NODES",
        "PATH",
        "STAGE",
        "AGE",
        *(("FAILED-PATHS", "REASON") if wide else ()),
    )
    return table(head, cells, show_headers=headers)


def diagnosis_names(rows: Sequence[DiagnosisSummary]) -> str:
    """A line per Diagnosis as ``kubectl get -o name`` writes it."""
    return "".join(f"{DIAGNOSIS.singular}.{DIAGNOSIS.group}/{d.name}\n" for d in rows)


def _paths_table(paths: Sequence[PathRow]) -> str:
    cells = [[str(p.index), p.outcome, " -> ".join(p.operations) or "-"] for p in paths]
    return table(("PATH", "OUTCOME", "OPERATIONS"), cells)


def _tasks_table(tasks: Sequence[TaskRow]) -> str:
    cells = [[t.target, t.operation, t.phase, cut(t.reason) or "-"] for t in tasks]
    return table(("TARGET", "OPERATION", "PHASE", "REASON"), cells)


def describe_diagnosis_text(
    d: DiagnosisSummary,
    paths: Sequence[PathRow],
    counts: Mapping[str, int],
    failed: Sequence[TaskRow],
    events: Sequence[EventRow],
    *,
    now: datetime,
) -> str:
    """The Diagnosis, its paths with their outcomes, its Tasks per phase, the failed ones with their reasons,
    and its latest Events."""
    where = f"path {d.path}, stage {_stage(d)}" if d.path is not None else "-"
    head = [
        f"Name:          {d.name}",
        f"Namespace:     {d.namespace}",
        f"OperationSet:  {d.operation_set}",
        f"Phase:         {d.phase or '(new)'}",
        *([f"Reason:        {d.reason}"] if d.reason else []),
        f"Nodes:         {d.nodes}",
        f"Running:       {where}",
        f"Tasks:         {', '.join(f'{phase} {counts.get(phase, 0)}' for phase in TASK_PHASES)}",
        f"Age:           {age(d.created, now)}",
        "",
    ]
    parts = ["\n".join(head)]
    parts.append("Paths:\n" + (_paths_table(paths) if paths else "  none yet\n"))
    parts.append("Failed tasks:\n" + (_tasks_table(failed) if failed else "  none\n"))
    parts.append("Events:\n" + (events_table(events) if events else "  none\n"))
    return "\n".join(parts)


def diagnosis_line(d: DiagnosisSummary, *, when: str) -> str:
    """One line for a change of a Diagnosis (``ctl watch``)."""
    where = f" path={d.path} stage={d.stage}" if d.path is not None else ""
    tasks = " ".join(f"{k}={v}" for k, v in d.stage_tasks.items())
    reason = f" reason={' '.join(d.reason.split())!r}" if d.reason and d.final else ""
    return f"{when} {d.ref} phase={d.phase or '(new)'} nodes={d.nodes}{where}{' ' + tasks if tasks else ''}{reason}"
