"""The agent's side of the store's outbox: new reports go out as they land, acknowledged ones leave it.

Reports are written by the task walk (:mod:`roles.edge.task_runner`), in the same transaction as the
result they carry; each hub session feeds every unacknowledged one to its writer in ``seq`` order,
then each new one as :meth:`Outbox.grew` announces it. A report leaves the outbox only when a hub
acknowledges it, or refuses it for good (``report_rejected``, ``job_gone``), so an agent restart or
an outage loses nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import NoReturn, final

import anyio

from nodetask.messages import Report
from nodetask.route import Route
from roles.edge.store.records import NodeTask
from roles.edge.store.store import EdgeStore

__all__ = ["Outbox"]


@final
class Outbox:
    """Wakes the sessions' feeders when reports land, and whoever drains it when the hub acknowledges them."""

    def __init__(self, store: EdgeStore) -> None:
        self._store = store
        self._changed = anyio.Event()
        self._acked = anyio.Event()

    def grew(self) -> None:
        """New reports were written to the store."""
        self._changed.set()
        self._changed = anyio.Event()

    async def acknowledge(self, seq: int) -> None:
        """A hub took the report ``seq``."""
        await self._store.acknowledge(seq)
        self._acked.set()
        self._acked = anyio.Event()

    async def drop(self, seq: int, reason: str) -> None:
        """A hub refused the report ``seq`` for good: it leaves the outbox, kept among the dropped with ``reason``."""
        await self._store.drop(seq, reason)

    async def drain(self, within: float) -> bool:
        """Wait (at most ``within`` seconds) until the hub acknowledged everything in the outbox."""
        with anyio.move_on_after(within):
            while True:
                acked = self._acked
                if not await self._store.pending(limit=1):
                    return True
                await acked.wait()
        return False

    async def resend_latest(self, task: NodeTask) -> None:
        """A re-delivered task: never run again, report the newest recorded result again."""
        progress = await self._store.progress(task.job_uid)
        if progress:
            last = progress[-1]
            await self._store.append(
                route=task.route,
                job_uid=task.job_uid,
                action=last.action,
                succ=last.succ,
                finish_time=last.finish_time,
                reason=last.reason,
                extend=last.extend,
                attempt=task.attempt,
            )
            self.grew()

    async def feed(self, send: Callable[[Report], Awaitable[None]]) -> NoReturn:
        """Send everything unacknowledged, in ``seq`` order, then each new report as it lands; until cancelled."""
        sent = 0
        while True:
            changed = self._changed
            for report in await self._store.pending(after=sent):
                try:
                    route = Route.parse(report.route)
                except ValueError as exc:
                    await self._store.drop(report.seq, f"unsendable route: {exc}")
                    continue
                frame = Report(
                    route=route,
                    job_uid=report.job_uid,
                    seq=report.seq,
                    action=report.action,
                    succ=report.succ,
                    finish_time=report.finish_time,
                    reason=report.reason,
                    extend=report.extend,
                    attempt=report.attempt,
                )
                await send(frame)
                sent = report.seq
            await changed.wait()
