"""How often a Node's autonomy duration may reach its Pods: one change per interval, the latest value winning.

Whoever may patch a Node chooses its duration, and each change of it costs a patch of every Pod bound
to the node; flapping the annotation would turn each of the patcher's writes into a write of each of
those Pods. So the binding the Pods are held to (:attr:`Pace.applied`) changes at most once per
interval: a change seen sooner waits until the interval is over, and then the Node's binding at that
moment is applied, whatever came in between (values that came and went are never applied). The first
sight of a node (a controller starting, a Node created) takes its binding at once, and starts an
interval. Annotation flapping then costs at most one patch of each bound Pod per node and interval.

Pure: the caller passes the loop time, and looks again at the time returned.
"""

from __future__ import annotations

from dataclasses import dataclass

from flows.autonomy.toleration_binding import Binding

__all__ = ["Pace", "paced"]


@dataclass(frozen=True, slots=True)
class Pace:
    """Where a node's binding stands: the one applied to its Pods, and since when."""

    applied: Binding | None
    """What the node's Pods are bound to (None: not bound, their own tolerations)."""
    since: float
    """The loop time at which ``applied`` took effect; the next change waits until ``since`` + interval."""


def paced(pace: Pace | None, wanted: Binding | None, *, now: float, interval: float) -> tuple[Pace, float | None]:
    """The pace once the node is seen asking for ``wanted`` at loop time ``now`` (``pace`` None: first sight).

    Returns the new pace and the loop time to look again (with the node's binding then), or None when
    nothing is held back.
    """
    if pace is None:
        return Pace(wanted, now), None
    if wanted == pace.applied:
        return pace, None
    ready = pace.since + interval
    if now >= ready:
        return Pace(wanted, now), None
    return pace, ready
