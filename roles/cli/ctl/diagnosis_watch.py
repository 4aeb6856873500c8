"""``ctl watch diagnosis/NAME...``: follow Diagnoses and their Events until each has Succeeded or Failed.

As ``ctl watch`` of jobs (``roles.cli.ctl.watch``): two watches per Diagnosis forward into one stream a
single loop reads. A line per change (the run's phase, path, stage and its Tasks' counts), or a JSON line
with ``-o json``. Exit 0 when every Diagnosis Succeeded, 1 when one Failed or was deleted.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TextIO

import anyio
import msgspec

from roles.cli.ctl.diagnosis_fetch import diagnosis_events_selector, find_diagnosis
from roles.cli.ctl.diagnosis_text import diagnosis_line
from roles.cli.ctl.diagnosis_views import DiagnosisSummary, summarize_diagnosis
from roles.cli.ctl.text import event_line
from roles.cli.ctl.views import EventRow, event_rows
from roles.cli.ctl.watch import Update, forward, now_text
from roles.kube import Deleted, Kube, Relisted, Upserted, WatchEvent
from roles.kube.resources import DIAGNOSES, EVENTS
from schemas.core import Event
from schemas.diagnosis.v1 import DiagnosisPhase

__all__ = ["DiagnosisLines", "Followed", "followed", "settled", "watch_diagnoses"]


@dataclass(frozen=True, slots=True)
class Followed:
    diagnoses: Mapping[str, DiagnosisSummary | None]
    """By ``diagnosis/name``: the latest summary (None: deleted)."""
    seen: frozenset[tuple[str, int]] = frozenset()
    """Events reported, by (name, count)."""


def _shown(d: DiagnosisSummary | None) -> object:
    """What a person sees of a Diagnosis: a change of anything else (its resourceVersion) is no change."""
    if d is None:
        return None
    return (d.phase, d.nodes, d.path, d.stage, tuple(d.stage_tasks.items()), d.failed_paths, d.reason)


def followed(state: Followed, ref: str, diagnosis: DiagnosisSummary | None) -> tuple[Followed, bool]:
    """The state after ``ref`` changed to ``diagnosis`` (None: deleted), and whether a person would see a change."""
    changed = ref not in state.diagnoses or _shown(state.diagnoses[ref]) != _shown(diagnosis)
    return dataclasses.replace(state, diagnoses=MappingProxyType({**state.diagnoses, ref: diagnosis})), changed


def settled(state: Followed) -> int | None:
    """None while a followed Diagnosis can still change; then 0 if every one Succeeded, else 1."""
    if any(d is not None and not d.final for d in state.diagnoses.values()):
        return None
    every = all(d is not None and d.phase == DiagnosisPhase.SUCCEEDED for d in state.diagnoses.values())
    return 0 if every else 1


class DiagnosisLines:
    """A line per change (plain, or a JSON object with ``json``), flushed at once."""

    def __init__(self, out: TextIO, *, json: bool = False, clock: Callable[[], str] = now_text) -> None:
        self._out = out
        self._json = json
        self._clock = clock

    def _line(self, text: str) -> None:
        self._out.write(text + "\n")
        self._out.flush()

    def diagnosis(self, ref: str, d: DiagnosisSummary | None) -> None:
        when = self._clock()
        if self._json:
            body = {"diagnosis": d} if d is not None else {"deleted": ref}
            self._line(msgspec.json.encode({"time": when, **body}).decode())
        else:
            self._line(diagnosis_line(d, when=when) if d is not None else f"{when} {ref} deleted")

    def event(self, event: EventRow) -> None:
        when = self._clock()
        if self._json:
            self._line(msgspec.json.encode({"time": when, "event": event}).decode())
        else:
            self._line(event_line(event, when=when))


async def watch_diagnoses(kube: Kube, names: list[str], *, namespace: str, lines: DiagnosisLines) -> int:
    """Follow the Diagnoses ``names`` of ``namespace`` until each is final; the exit status (0: all Succeeded).

    Errors: :class:`~roles.cli.ctl.fetch.CtlError` for a Diagnosis that cannot be found, before any watch starts.
    """
    found = [summarize_diagnosis(await find_diagnosis(kube, name, namespace=namespace)) for name in names]
    state = Followed(diagnoses=MappingProxyType({}))
    for summary in found:
        state, _ = followed(state, summary.ref, summary)
        lines.diagnosis(summary.ref, summary)
    done = settled(state)
    if done is not None:
        return done
    send, receive = anyio.create_memory_object_stream[Update](max_buffer_size=math.inf)
    async with send, receive, anyio.create_task_group() as tg:
        for summary in found:
            follow = functools.partial(forward, kube, updates=send, ref=summary.ref, namespace=namespace)
            name_is = f"metadata.name={summary.name}"
            tg.start_soon(functools.partial(follow, DIAGNOSES, what="diagnosis", field_selector=name_is))
            events_of = diagnosis_events_selector(summary.name)
            tg.start_soon(functools.partial(follow, EVENTS, what="event", field_selector=events_of))
        async for what, ref, event in receive:
            state = _apply(state, lines, what=what, ref=ref, event=event)
            done = settled(state)
            if done is not None:
                tg.cancel_scope.cancel()
                return done
    raise AssertionError("the updates stream ended while its watches ran")


def _apply(state: Followed, lines: DiagnosisLines, *, what: str, ref: str, event: WatchEvent) -> Followed:
    if what == "event":
        items: tuple[Event, ...] = (
            (event.obj,) if isinstance(event, Upserted) else event.objects if isinstance(event, Relisted) else ()
        )
        for item in items:
            key = (item.metadata.name, item.count)
            if key not in state.seen:
                state = dataclasses.replace(state, seen=state.seen | {key})
                lines.event(event_rows((item,), limit=1)[0])
        return state
    summary: DiagnosisSummary | None
    if isinstance(event, Upserted):
        summary = summarize_diagnosis(event.obj)
    elif isinstance(event, Relisted):
        summary = summarize_diagnosis(event.objects[0]) if event.objects else None
    elif isinstance(event, Deleted):
        summary = None
    else:
        return state  # Interrupted (the watch relists by itself) or Invalid
    state, changed = followed(state, ref, summary)
    if changed:
        lines.diagnosis(ref, summary)
    return state
