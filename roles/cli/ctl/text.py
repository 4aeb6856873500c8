"""Plain-text output of the operator's CLI: ``kubectl``-style tables, and JSON or YAML for scripts."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

import msgspec

from roles.cli.ctl.views import COUNT_KEYS, EdgeRow, EventRow, JobSummary, NodeRow, age
from schemas.kinds import GROUP

__all__ = [
    "FORMATS",
    "cut",
    "describe_text",
    "edges_table",
    "encode",
    "event_line",
    "events_table",
    "job_names",
    "jobs_table",
    "progress_line",
    "table",
]

FORMATS: Final = ("table", "json", "yaml")
COUNT_HEADERS: Final = ("PENDING", "IN-PROGRESS", "SUCCESSFUL", "FAILURE", "UNKNOWN")
MESSAGE_LIMIT: Final = 160
"""Characters of a reason or message in a table cell (a failed pull lists every image's error); the
JSON and YAML output have them whole."""


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, show_headers: bool = True) -> str:
    """Left-aligned columns three spaces apart, as ``kubectl get`` prints them (the last one unpadded); the
    headers set the widths even when not shown (``--no-headers``), as kubectl's do."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        padded = [c.ljust(w) for c, w in zip(cells[:-1], widths[:-1], strict=True)]
        return "   ".join([*padded, cells[-1]]).rstrip()

    lines = [line(r) for r in rows]
    return "\n".join([line(headers), *lines] if show_headers else lines) + "\n"


def job_names(jobs: Sequence[JobSummary]) -> str:
    """A line per job as ``kubectl get -o name`` writes it: ``KIND.GROUP/NAME``."""
    return "".join(f"{j.kind}.{GROUP}/{j.name}\n" for j in jobs)


def encode(value: Any, fmt: str) -> str:
    """``value`` (rows, or a mapping of them) as indented JSON or as YAML."""
    if fmt == "yaml":
        return msgspec.yaml.encode(value).decode()
    return msgspec.json.format(msgspec.json.encode(value).decode(), indent=2) + "\n"


def cut(text: str) -> str:
    """``text`` on one line, at most :data:`MESSAGE_LIMIT` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= MESSAGE_LIMIT else flat[: MESSAGE_LIMIT - 1] + "…"


def jobs_table(jobs: Sequence[JobSummary], *, now: datetime, headers: bool = True, wide: bool = False) -> str:
    """One row a job; ``wide`` (``-o wide``) adds what it does and the reason of its phase."""
    rows = [
        [
            j.kind,
            j.name,
            j.phase or "(new)",
            str(j.total),
            *(str(j.counts.get(k, 0)) for k in COUNT_KEYS),
            age(j.created, now),
            *((cut(j.target) or "-", cut(j.reason) or "-") if wide else ()),
        ]
        for j in jobs
    ]
    extra = ("TARGET", "REASON") if wide else ()
    return table(("KIND", "NAME", "PHASE", "NODES", *COUNT_HEADERS, "AGE", *extra), rows, show_headers=headers)


def nodes_table(rows: Sequence[NodeRow]) -> str:
    cells = [
        [
            r.node,
            r.phase,
            f"{r.last_action} ({r.last_action_status})" if r.last_action else "-",
            cut(r.reason) or "-",
            r.hub or "-",
            r.agent_version or "-",
        ]
        for r in rows
    ]
    return table(("NODE", "PHASE", "LAST ACTION", "REASON", "HUB", "AGENT"), cells)


def edges_table(rows: Sequence[EdgeRow]) -> str:
    cells = [
        [r.name, "yes" if r.connected else "no", r.hub or "-", r.agent_version or "-", "yes" if r.ready else "no"]
        for r in rows
    ]
    return table(("NAME", "CONNECTED", "HUB", "AGENT", "READY"), cells)


def events_table(rows: Sequence[EventRow]) -> str:
    cells = [[r.time or "-", r.type, r.reason, cut(r.message)] for r in rows]
    return table(("TIME", "TYPE", "REASON", "MESSAGE"), cells)


def describe_text(
    job: JobSummary, nodes: Sequence[NodeRow], events: Sequence[EventRow], *, now: datetime, only: Sequence[str] = ()
) -> str:
    """The job, its ``nodes`` (those in the phases ``only`` names, when it names any) and its events."""
    counts = ", ".join(f"{k} {job.counts.get(k, 0)}" for k in COUNT_KEYS)
    head = [
        f"Name:    {job.name}",
        f"Kind:    {job.kind}",
        f"Phase:   {job.phase or '(new)'}",
        *([f"Reason:  {job.reason}"] if job.reason else []),
        f"Nodes:   {job.total} ({counts})",
        f"Age:     {age(job.created, now)}",
        "",
    ]
    if only:
        shown = f"Nodes in {' or '.join(only)}: {len(nodes)} of {job.total}\n"
        parts = ["\n".join(head), shown + (nodes_table(nodes) if nodes else "")]
    else:
        parts = ["\n".join(head), nodes_table(nodes) if nodes else "No nodes yet.\n"]
    parts.append("\nEvents:\n" + (events_table(events) if events else "  none\n"))
    return "\n".join(parts).replace("\n\n\n", "\n\n")


def progress_line(job: JobSummary, *, when: str) -> str:
    """One line for a change of ``job`` (the non-terminal ``ctl watch`` output)."""
    counts = " ".join(f"{k}={job.counts.get(k, 0)}" for k in COUNT_KEYS)
    reason = f" reason={' '.join(job.reason.split())!r}" if job.reason and job.final else ""
    return f"{when} {job.ref} phase={job.phase or '(new)'} nodes={job.total} {counts}{reason}"


def event_line(event: EventRow, *, when: str) -> str:
    return f"{when} {event.object} event {event.type} {event.reason}: {' '.join(event.message.split())}"
