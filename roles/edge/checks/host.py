"""Host readings through psutil for the check items (:mod:`roles.edge.checks.checks` decides on them).

A module of its own so that psutil is loaded by the first Check, not when the agent starts.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

import psutil

from roles.edge.checks.readings import ROOT, CheckItem, DiskReading, MeasureError, Reading, Usage

__all__ = ["measure_blocking"]


def _read(fn: Callable[[], float]) -> Reading:
    try:
        return float(fn())
    except (OSError, RuntimeError, psutil.Error) as exc:
        return MeasureError(str(exc))


def _disk_percent(path: str) -> float:
    return float(psutil.disk_usage(path).percent)


def _disks(data_dir: Path) -> tuple[DiskReading, ...]:
    readings: list[DiskReading] = []
    seen: set[int] = set()
    for path in (ROOT, str(data_dir)):
        try:
            device = os.stat(path).st_dev
        except OSError as exc:
            readings.append(DiskReading(path=path, percent=MeasureError(str(exc))))
            continue
        if device not in seen:
            seen.add(device)
            readings.append(DiskReading(path=path, percent=_read(functools.partial(_disk_percent, path))))
    return tuple(readings)


def measure_blocking(items: tuple[CheckItem, ...], data_dir: Path, cpu_interval: float) -> Usage:
    return Usage(
        cpu=_read(lambda: psutil.cpu_percent(interval=cpu_interval)) if CheckItem.CPU in items else None,
        mem=_read(lambda: psutil.virtual_memory().percent) if CheckItem.MEM in items else None,
        disks=_disks(data_dir) if CheckItem.DISK in items else (),
    )
