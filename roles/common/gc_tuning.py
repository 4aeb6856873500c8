"""Garbage-collector settings for a process holding thousands of long-lived connections."""

from __future__ import annotations

import gc
from typing import Final

__all__ = ["GC_YOUNG_THRESHOLD", "tune_gc"]

GC_YOUNG_THRESHOLD: Final = 20_000
"""Allocations between two collections of the youngest generation (CPython's default is 700)."""


def tune_gc() -> None:
    """Fewer garbage collections: what exists now is frozen, the young generation larger.

    Every frame a hub handles allocates a few short-lived objects (trio's outcomes, the frame, its
    message). At CPython's default the collector ran every few dozen frames and went through the
    objects of thousands of sessions: about a third of a heartbeat echo's CPU in a bare trio-websocket
    server (docs/benchmarks.md). Such garbage dies by reference count; the collector only has the
    rare cycle to find, which a larger young generation still finds. A hub calls it once started;
    the benchmark's fleet once its edges are connected.
    """
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)
