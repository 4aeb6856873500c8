"""Host check items run before a node task's first action: ``cpu``, ``mem`` and ``disk``, as KubeEdge's.

The decision is a pure function of measured percentages (:func:`decide`); :func:`measure` is the
thin shell that asks psutil (:mod:`roles.edge.checks.host`), in a worker thread because the CPU reading
samples over an interval.

Compatibility with KubeEdge (``edge/pkg/taskmanager/actions/pre_check.go``): items are checked in
order and the first failure is the result; a reading fails when it is strictly above its threshold
(80% by default); the texts are KubeEdge's, including for an unknown item and for a reading that
could not be taken. Beyond KubeEdge, ``disk`` checks the agent's data directory as well as ``/``
(the store and the installed versions live there), and a failure on a filesystem other than ``/``
names it, since KubeEdge's text has no place for a path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import anyio.to_thread
import msgspec

from roles.edge.checks.readings import ROOT, CheckItem, MeasureError, Reading, Usage

__all__ = [
    "CheckResult",
    "Thresholds",
    "checked_items",
    "decide",
    "measure",
    "run_checks",
]


@dataclass(frozen=True, slots=True)
class Thresholds:
    """The highest usage, in percent, each item accepts. KubeEdge hard-codes 80 for all three."""

    cpu: float = 80.0
    mem: float = 80.0
    disk: float = 80.0

    def __post_init__(self) -> None:
        for item in CheckItem:
            limit = getattr(self, item.value)
            if not 0 <= limit <= 100:
                raise ValueError(f"the {item.value} threshold must lie in [0, 100], not {limit}")


class CheckResult(msgspec.Struct, frozen=True):
    """The outcome of a node's checks: ``reason`` is the first failure's text, empty when ok."""

    ok: bool
    reason: str = ""


_PASSED: Final = CheckResult(ok=True)
_KNOWN: Final = frozenset(CheckItem)
_FETCHED: Final = {CheckItem.CPU: "cpu usage", CheckItem.MEM: "virtual memory stat", CheckItem.DISK: "disk usage"}


def _exceeds(subject: str, percent: float, limit: float) -> str:
    # Go's %.2f and Python's both round the exact binary value half-to-even, so the texts match.
    return f"current {subject} is {percent:.2f}, which exceeds the maximum allowed usage {limit:.2f}"


def _judge(item: CheckItem, reading: Reading, limit: float, *, path: str = ROOT) -> str | None:
    if isinstance(reading, MeasureError):
        return f"failed to get {_FETCHED[item]}, err: {reading.error}"
    if reading <= limit:
        return None
    return _exceeds(f"{item.value} usage" if path == ROOT else f"{item.value} usage of {path}", reading, limit)


def _failure(item: CheckItem, usage: Usage, thresholds: Thresholds) -> str | None:
    if item is CheckItem.DISK:
        if not usage.disks:
            raise ValueError("disk usage was not measured")
        failures = (_judge(item, d.percent, thresholds.disk, path=d.path) for d in usage.disks)
        return next((f for f in failures if f is not None), None)
    reading = usage.cpu if item is CheckItem.CPU else usage.mem
    if reading is None:
        raise ValueError(f"{item.value} usage was not measured")
    return _judge(item, reading, thresholds.cpu if item is CheckItem.CPU else thresholds.mem)


def checked_items(items: Sequence[str]) -> tuple[CheckItem, ...]:
    """The items that get measured: those before the first unknown one, where KubeEdge stops."""
    known: list[CheckItem] = []
    for item in items:
        if item not in _KNOWN:
            break
        known.append(CheckItem(item))
    return tuple(known)


def decide(items: Sequence[str], usage: Usage, thresholds: Thresholds) -> CheckResult:
    """Check ``items`` in order against ``usage``; the first failure decides. Pure.

    Errors: ``ValueError`` if an item to check was not measured (a bug in the caller).
    """
    for item in items:
        if item not in _KNOWN:
            return CheckResult(ok=False, reason=f"check item {item} not support")
        failure = _failure(CheckItem(item), usage, thresholds)
        if failure is not None:
            return CheckResult(ok=False, reason=failure)
    return _PASSED


async def measure(items: Sequence[str], *, data_dir: Path, cpu_interval: float = 0.1) -> Usage:
    """Measure what :func:`decide` needs for ``items``, in a worker thread (the CPU reading takes
    ``cpu_interval`` seconds, KubeEdge's 100 ms by default). A reading psutil fails to take becomes a
    :class:`MeasureError`, which fails its item with KubeEdge's text.
    """
    needed = checked_items(items)
    if not needed:
        return Usage()
    # psutil is loaded by the first check, not at start: an idle agent is kept under 40 MiB.
    from roles.edge.checks import host  # noqa: PLC0415 (deferred on purpose)

    return await anyio.to_thread.run_sync(host.measure_blocking, needed, data_dir, cpu_interval)


async def run_checks(
    items: Sequence[str], *, data_dir: Path, thresholds: Thresholds, cpu_interval: float = 0.1
) -> CheckResult:
    """Measure and decide: the ``Check`` action's pre-check."""
    return decide(items, await measure(items, data_dir=data_dir, cpu_interval=cpu_interval), thresholds)
