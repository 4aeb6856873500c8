"""How the demo draws jobs, node counts and Events in the terminal (rich), live and as a summary."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Final

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from tools.demo.kube import EventView, JobView

PHASE_STYLE: Final = {"Completed": "green", "Failure": "red", "InProgress": "yellow", "Init": "cyan"}
COUNT_COLUMNS: Final = (
    ("pending", "pending"),
    ("inProgress", "running"),
    ("successful", "ok"),
    ("failure", "failed"),
    ("unknown", "timed out"),
)
"""``status.nodeCounts`` keys and their column headers (Pending, InProgress, Successful, Failure, Unknown)."""
WAITING_CONFIRMATION: Final = "WaitingConfirmation"
REASON_LIMIT: Final = 200


def _phase(phase: str) -> Text:
    return Text(phase or "(new)", style=PHASE_STYLE.get(phase, "dim"))


def _job(job: JobView) -> Text:
    return Text.assemble(job.name, "\n", (job.kind, "dim"))


def paused_for_confirmation(job: JobView) -> list[str]:
    """Nodes whose last reported action is a successful WaitingConfirmation, still in progress."""
    return [
        n.name
        for n in job.nodes
        if n.phase == "InProgress" and n.last_action == WAITING_CONFIRMATION and n.last_action_ok
    ]


def reasons(job: JobView) -> list[str]:
    """The distinct reasons of failed and timed-out nodes, most frequent first, with their counts.

    Long reasons are cut (a failed pull lists every image's gRPC error); the job's YAML has them whole.
    """
    counted = Counter(_cut(n.reason) for n in job.nodes if n.phase in ("Failure", "Unknown") and n.reason)
    return [f"{count}x {reason}" if count > 1 else reason for reason, count in counted.most_common()]


def attempts(job: JobView) -> list[str]:
    """For each retried node, its attempts: how the one before the latest ended, and the latest."""
    lines = []
    for node in job.nodes:
        before = node.previous
        if before is None:
            continue
        ended = f"{before.phase} at {before.action}" if before.action else before.phase
        why = f": {_cut(before.reason, 120)}" if before.reason else ""
        now = node.phase + (f" at {node.last_action}" if node.phase != "Successful" and node.last_action else "")
        lines.append(f"{node.name}: attempt {before.attempt} {ended}{why}; attempt {node.attempt} {now}")
    return lines


def _cut(text: str, limit: int = REASON_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def jobs_table(jobs: Sequence[JobView], *, title: str) -> Table:
    """One row per job: its phase, a progress bar of ended nodes, and node counts per phase."""
    table = Table(title=title, title_justify="left", expand=False)
    table.add_column("job", no_wrap=True)
    table.add_column("phase", no_wrap=True)
    table.add_column("nodes ended", no_wrap=True)
    for _, header in COUNT_COLUMNS:
        table.add_column(header, justify="right", no_wrap=True)
    for job in jobs:
        total = job.counts.get("total", len(job.nodes))
        bar = ProgressBar(total=max(total, 1), completed=job.done, width=16)
        progress = Table.grid(padding=(0, 1))
        progress.add_row(bar, Text(f"{job.done}/{total}"))
        counts = [
            Text(str(job.counts.get(key, 0)), style="dim" if not job.counts.get(key) else "")
            for key, _ in COUNT_COLUMNS
        ]
        table.add_row(_job(job), _phase(job.phase), progress, *counts)
    return table


def notes(jobs: Sequence[JobView], *, confirmation_help: str) -> list[Text]:
    """A line per job that is waiting for something or whose nodes failed: why, in the nodes' words."""
    lines: list[Text] = []
    for job in jobs:
        paused = paused_for_confirmation(job)
        if paused:
            lines.append(Text(f"{job.name}: {len(paused)} node(s) paused at WaitingConfirmation. {confirmation_help}"))
        found = reasons(job)
        if found:
            lines.append(Text(f"{job.name}: {found[0]}", style="red"))
    return lines


def events_table(events: Sequence[EventView]) -> Table:
    """The last Kubernetes Events the controller recorded on the jobs."""
    table = Table(title="last Kubernetes Events (namespace default)", title_justify="left", show_header=True)
    table.add_column("time", style="dim", no_wrap=True)
    table.add_column("type", no_wrap=True)
    table.add_column("job", no_wrap=True)
    table.add_column("reason", no_wrap=True)
    table.add_column("message", overflow="fold")
    for e in events:
        # An Event without a type is Normal (the controller omits the default).
        kind = e.type or "Normal"
        style = "red" if kind == "Warning" else "dim"
        table.add_row(e.time[11:19] or e.time, Text(kind, style=style), e.object, e.reason, e.message)
    return table


def live_view(
    jobs: Sequence[JobView], events: Sequence[EventView], *, header: str, confirmation_help: str
) -> RenderableType:
    parts: list[RenderableType] = [Text(header, style="bold")]
    parts.append(jobs_table(jobs, title="node jobs (live)"))
    parts.extend(notes(jobs, confirmation_help=confirmation_help))
    if events:
        parts.append(events_table(events))
    return Group(*parts)


def summary_table(jobs: Sequence[JobView], unfinished: Sequence[str]) -> Table:
    """The end state of every job and, for nodes that did not succeed, why."""
    table = Table(title="summary", title_justify="left", show_lines=True)
    table.add_column("job", no_wrap=True)
    table.add_column("phase", no_wrap=True)
    table.add_column("ok", justify="right")
    table.add_column("failed", justify="right")
    table.add_column("timed out", justify="right")
    table.add_column("of", justify="right")
    table.add_column("why (job reason, then node reasons)", overflow="fold")
    for job in jobs:
        why = reasons(job)
        if job.reason and job.reason not in why:
            why.insert(0, job.reason)
        if job.run > 1:
            why.extend([f"retried (run {job.run}):", *attempts(job)])
        if job.name in unfinished:
            why.insert(0, "did not finish within the demo's time limit")
        c = job.counts
        table.add_row(
            _job(job),
            _phase(job.phase),
            str(c.get("successful", 0)),
            str(c.get("failure", 0)),
            str(c.get("unknown", 0)),
            str(c.get("total", len(job.nodes))),
            "\n".join(why) or "-",
        )
    return table
