"""``ctl watch`` on a terminal: a live progress bar per job, its node counts per phase, the latest Events.

The only module of the project's roles that imports rich, which comes with the ``ctl`` extra (and the
demo's); without it ``ctl watch`` prints a plain line per change instead.
"""

from __future__ import annotations

from types import TracebackType
from typing import Final

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from roles.cli.ctl.follow import WatchState
from roles.cli.ctl.views import COUNT_KEYS, EventRow, JobSummary

__all__ = ["LiveView"]

PHASE_STYLE: Final = {"Completed": "green", "Failure": "red", "InProgress": "yellow", "Init": "cyan"}
COUNT_HEADERS: Final = ("pending", "running", "ok", "failed", "timed out")


def render(state: WatchState) -> RenderableType:
    jobs = Table(title="node jobs", title_justify="left")
    jobs.add_column("job", no_wrap=True)
    jobs.add_column("phase", no_wrap=True)
    jobs.add_column("nodes ended", no_wrap=True)
    for header in COUNT_HEADERS:
        jobs.add_column(header, justify="right", no_wrap=True)
    for ref, job in state.jobs.items():
        if ref in state.deleted:
            jobs.add_row(ref, Text("deleted", style="red"), "", *("" for _ in COUNT_KEYS))
            continue
        if job is None:
            jobs.add_row(ref, Text("(waiting)", style="dim"), "", *("" for _ in COUNT_KEYS))
            continue
        progress = Table.grid(padding=(0, 1))
        progress.add_row(
            ProgressBar(total=max(job.total, 1), completed=job.ended, width=20), f"{job.ended}/{job.total}"
        )
        counts = [Text(str(job.counts.get(k, 0)), style="" if job.counts.get(k) else "dim") for k in COUNT_KEYS]
        phase = Text(job.phase or "(new)", style=PHASE_STYLE.get(job.phase, "dim"))
        jobs.add_row(ref, phase, progress, *counts)
    parts: list[RenderableType] = [jobs]
    if state.events:
        events = Table(title="latest Events", title_justify="left")
        for column in ("time", "type", "object", "reason", "message"):
            events.add_column(column, overflow="fold", no_wrap=column != "message")
        for e in state.events:
            events.add_row(
                e.time, Text(e.type, style="red" if e.type == "Warning" else "dim"), e.object, e.reason, e.message
            )
        parts.append(events)
    return Group(*parts)


class LiveView:
    """Redraws the watched jobs in place until closed; the last frame stays on the terminal."""

    def __init__(self, console: Console | None = None) -> None:
        self._live = Live(console=console or Console(), auto_refresh=False, transient=False)

    def __enter__(self) -> LiveView:
        self._live.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._live.__exit__(kind, error, trace)

    def show(self, state: WatchState) -> None:
        self._live.update(render(state), refresh=True)

    # The watch's presenter: every change redraws the whole view.
    def job(self, state: WatchState, job: JobSummary) -> None:
        self.show(state)

    def deleted(self, state: WatchState, ref: str) -> None:
        self.show(state)

    def event(self, state: WatchState, event: EventRow) -> None:
        self.show(state)
