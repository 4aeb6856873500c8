"""Node tasks and results as the store's tests store them, on a clock that ticks a second per reading."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from roles.edge.store.records import ActionProgress
from roles.edge.store.store import EdgeStore

ROUTE = "operations.kubeedge.io/v1alpha2/nodeupgradejob/up-1/nodes/edge-1"


def ticking_clock() -> Callable[[], datetime]:
    """A wall clock that advances one second per reading, so stored times are predictable."""
    ticks = itertools.count()
    base = datetime(2026, 1, 1, tzinfo=UTC)
    return lambda: base + timedelta(seconds=next(ticks))


async def add(store: EdgeStore, uid: str, *, action: str = "Check") -> None:
    await store.add_task(
        job_uid=uid,
        route=ROUTE,
        job_type="nodeupgradejob",
        spec=b'{"version":"v1.2.3"}',
        run_action_id="r1",
        action=action,
    )


def progress(uid: str, action: str, *, succ: bool = True, extend: str = "") -> ActionProgress:
    return ActionProgress(job_uid=uid, action=action, succ=succ, finish_time="2026-01-01T00:00:05Z", extend=extend)
