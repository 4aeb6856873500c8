"""Every wait of a benchmark has a deadline, and a wait that runs out says what it waited for.

A benchmark that cannot finish (a hub that stopped marking Nodes, a fleet that never connects) must
fail within minutes naming what did not happen, not sit there for half an hour or for ever.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import anyio


class Stalled(Exception):
    """A benchmark waited longer than its deadline; the message says for what and how far it got."""


def deadline_for(items: int, *, per_item_s: float = 0.05, floor_s: float = 120.0) -> float:
    """A deadline for a wait whose work grows with ``items`` (sessions, nodes): generous, but minutes.

    10,000 sessions were welcomed in 55 s and marked in 123 s on the 2-core machine of
    docs/benchmarks.md; the default allows 4 times that.
    """
    return max(floor_s, items * per_item_s)


@contextmanager
def deadline(what: str, limit_s: float) -> Iterator[None]:
    """Fail the block with :class:`Stalled` naming ``what`` if it takes more than ``limit_s`` seconds."""
    with anyio.move_on_after(limit_s) as scope:
        yield
    if scope.cancelled_caught:
        raise Stalled(f"waited {limit_s:.0f} s for {what}")


async def until_count(
    what: str,
    count: Callable[[], Awaitable[float]],
    target: float,
    *,
    limit_s: float,
    interval_s: float = 0.2,
) -> float:
    """Poll ``count()`` until it reaches ``target``; its last value.

    Raises :class:`Stalled` after ``limit_s`` seconds, e.g. "waited 300 s for Nodes marked: 733 of
    1000 (the count last moved 291 s ago)".
    """
    started = anyio.current_time()
    value, moved = 0.0, started
    with anyio.move_on_after(limit_s):
        while True:
            now = await count()
            if now != value:
                value, moved = now, anyio.current_time()
            if value >= target:
                return value
            await anyio.sleep(interval_s)
    since = anyio.current_time() - moved
    raise Stalled(
        f"waited {limit_s:.0f} s for {what}: {value:g} of {target:g} (the count last moved {since:.0f} s ago)"
    )
