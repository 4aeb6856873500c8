"""``ctl watch JOB...``: follow jobs and their Events until every one is final.

Two watches per job (the job, by name; its Events), each forwarding into one stream that a single
loop reads, so the state (``roles.cli.ctl.follow``) has one writer. Each change goes to a presenter: a
live view on a terminal (``roles.cli.ctl.live``), otherwise a plain line per change, or a JSON line
with ``-o json``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol, TextIO

import anyio
import anyio.abc
import msgspec

from roles.cli.ctl.fetch import events_selector, resolve
from roles.cli.ctl.follow import WatchState, on_event, on_job, outcome
from roles.cli.ctl.text import event_line, progress_line
from roles.cli.ctl.views import EventRow, JobSummary, event_rows, summarize
from roles.common.events import EVENT_NAMESPACE
from roles.kube import Deleted, Kube, Relisted, Resource, Upserted, WatchEvent
from roles.kube.resources import EVENTS, job_resource
from schemas.core import Event

__all__ = ["JsonLines", "PlainLines", "Presenter", "Update", "forward", "now_text", "watch"]

Update = tuple[str, str, WatchEvent]
"""(``job`` or ``event``, the job's ``kind/name``, what its watch delivered)."""


class Presenter(Protocol):
    def job(self, state: WatchState, job: JobSummary) -> None: ...
    def deleted(self, state: WatchState, ref: str) -> None: ...
    def event(self, state: WatchState, event: EventRow) -> None: ...


def now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PlainLines:
    """A line per change (for logs, CI and pipes), flushed at once."""

    def __init__(self, out: TextIO, *, clock: Callable[[], str] = now_text) -> None:
        self._out = out
        self._clock = clock

    def _line(self, text: str) -> None:
        self._out.write(text + "\n")
        self._out.flush()

    def job(self, state: WatchState, job: JobSummary) -> None:
        self._line(progress_line(job, when=self._clock()))

    def deleted(self, state: WatchState, ref: str) -> None:
        self._line(f"{self._clock()} {ref} deleted")

    def event(self, state: WatchState, event: EventRow) -> None:
        self._line(event_line(event, when=self._clock()))


class JsonLines(PlainLines):
    """A JSON object per change: ``{"job": ...}``, ``{"deleted": "kind/name"}`` or ``{"event": ...}``."""

    def job(self, state: WatchState, job: JobSummary) -> None:
        self._line(msgspec.json.encode({"time": self._clock(), "job": job}).decode())

    def deleted(self, state: WatchState, ref: str) -> None:
        self._line(msgspec.json.encode({"time": self._clock(), "deleted": ref}).decode())

    def event(self, state: WatchState, event: EventRow) -> None:
        self._line(msgspec.json.encode({"time": self._clock(), "event": event}).decode())


async def forward(
    kube: Kube,
    resource: Resource[Any],
    updates: anyio.abc.ObjectSendStream[Update],
    *,
    what: str,
    ref: str,
    field_selector: str,
    namespace: str = "",
) -> None:
    """Send each of ``resource``'s watch events as ``(what, ref, event)`` to ``updates``, until cancelled."""
    send, receive = anyio.create_memory_object_stream[WatchEvent](max_buffer_size=math.inf)
    async with anyio.create_task_group() as tg, receive:
        tg.start_soon(functools.partial(kube.watch, resource, send, field_selector=field_selector, namespace=namespace))
        async for event in receive:
            await updates.send((what, ref, event))


async def watch(kube: Kube, jobs: list[str], presenter: Presenter) -> int:
    """Follow ``jobs`` (``NAME`` or ``KIND/NAME`` each) until all are final; the exit status (0: all Completed).

    Errors: :class:`~roles.cli.ctl.fetch.CtlError` for a job that cannot be found, before any watch starts.
    """
    targets = [await resolve(kube, text) for text in jobs]
    kinds = {f"{kind.singular}/{job.metadata.name}": kind for kind, job in targets}
    state = WatchState.start(kinds)
    for kind, job in targets:
        summary = summarize(kind, job)
        state, _ = on_job(state, summary.ref, summary)
        presenter.job(state, summary)
    done = outcome(state)
    if done is not None:
        return done
    send, receive = anyio.create_memory_object_stream[Update](max_buffer_size=math.inf)
    # The task group ends (its watches stopped) before the stream they write to is closed.
    async with send, receive, anyio.create_task_group() as tg:
        for ref, kind in kinds.items():
            name = ref.partition("/")[2]
            follow = functools.partial(forward, kube, updates=send, ref=ref)
            tg.start_soon(
                functools.partial(follow, job_resource(kind), what="job", field_selector=f"metadata.name={name}")
            )
            tg.start_soon(
                functools.partial(
                    follow,
                    EVENTS,
                    what="event",
                    field_selector=events_selector(kind, name),
                    namespace=EVENT_NAMESPACE,
                )
            )
        async for what, ref, event in receive:
            state = _apply(state, presenter=presenter, kinds=kinds, what=what, ref=ref, event=event)
            done = outcome(state)
            if done is not None:
                tg.cancel_scope.cancel()
                return done
    raise AssertionError("the updates stream ended while its watches ran")


def _apply(
    state: WatchState, *, presenter: Presenter, kinds: dict[str, Any], what: str, ref: str, event: WatchEvent
) -> WatchState:
    """Apply one watch event; present what changed."""
    if what == "event":
        events: tuple[Event, ...] = ()
        if isinstance(event, Upserted):
            events = (event.obj,)
        elif isinstance(event, Relisted):
            events = event.objects
        for item in events:
            (row,) = event_rows((item,), limit=1)
            state, new = on_event(state, item.metadata.name, row)
            if new:
                presenter.event(state, row)
        return state
    summary: JobSummary | None
    if isinstance(event, Upserted):
        summary = summarize(kinds[ref], event.obj)
    elif isinstance(event, Relisted):
        summary = summarize(kinds[ref], event.objects[0]) if event.objects else None
    elif isinstance(event, Deleted):
        summary = None
    else:
        return state  # Interrupted (the watch relists by itself) or Invalid (the controller reports it)
    state, changed = on_job(state, ref, summary)
    if changed and summary is None:
        presenter.deleted(state, ref)
    elif changed and summary is not None:
        presenter.job(state, summary)
    return state
