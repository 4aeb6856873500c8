"""The per-job concurrency pool that every node task runs under.

Trio's ``CapacityLimiter`` is "a sack that starts out holding some fixed number of tokens": a job
with ``concurrency: 3`` has a sack of three. A node task takes a token when it is dispatched and gives
it back when it ends - its final result arrives, its timeout expires or the job is interrupted - and
the token is held in one ``async with`` so that no other code path can release it (KubeEdge releases
from the upstream handler, twice on some paths, and never on timeout).

A pool belongs to one job *UID*: a job deleted and re-created under the same name gets a fresh pool,
and the old one has unwound completely before :meth:`JobPool.interrupt` returns.

A node task waiting for something outside the pool (a hub's Pending node waiting for the job to have
a free slot, which another hub's nodes hold) lends its token meanwhile (:meth:`JobPool.token_lent`):
holding it, it would keep a node already dispatched, queued behind it, from running at all.
"""

from __future__ import annotations

import contextvars
import enum
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import final

import anyio
import anyio.abc

__all__ = ["JobPool", "NodeTaskEnd", "open_job_pool"]

NodeWork = Callable[[], Awaitable[None]]
"""A node task's body: dispatch, then wait for the final result. Returning means it finished."""

OnEnd = Callable[[str, "NodeTaskEnd"], None]
"""Told once per node task how it ended; synchronous so it also runs while being cancelled."""

_Queued = tuple[str, NodeWork, float, OnEnd | None]

_HOLDING: contextvars.ContextVar[list[bool]] = contextvars.ContextVar("nodetask_pool_holding")
"""In a node task: whether it holds its token now (one mutable cell per task, set where the task starts)."""


class NodeTaskEnd(enum.StrEnum):
    """How a node task left the pool."""

    FINISHED = "finished"
    TIMED_OUT = "timed_out"
    INTERRUPTED = "interrupted"
    FAILED = "failed"
    """The body raised; the exception then propagates to the pool's owner."""


@final
class JobPool:
    """Runs node tasks of one job with at most ``limit`` of them dispatched at once.

    Create with :func:`open_job_pool`. All methods are called from the event loop's thread.
    """

    def __init__(self, *, uid: str, concurrency: int, task_group: anyio.abc.TaskGroup) -> None:
        self.uid = uid
        self.limit = concurrency if concurrency > 0 else 1  # KubeEdge: size <= 0 means 1
        self._limiter = anyio.CapacityLimiter(self.limit)
        self._tg = task_group
        self._queue_in, self._queue_out = anyio.create_memory_object_stream[_Queued](max_buffer_size=math.inf)
        self._nodes: set[str] = set()
        self._in_flight = 0
        self.peak_in_flight = 0
        self.ended: dict[str, NodeTaskEnd] = {}
        self.closed = anyio.Event()
        """Set once every node task has unwound and the pool is gone."""

    @property
    def in_flight(self) -> int:
        """Node tasks holding a token right now."""
        return self._in_flight

    @property
    def queued(self) -> int:
        """Node tasks started but still waiting for a token."""
        return len(self._nodes) - len(self.ended) - self._in_flight

    def __contains__(self, node: object) -> bool:
        return node in self._nodes

    def start(self, node: str, work: NodeWork, *, timeout: float, on_end: OnEnd | None = None) -> bool:
        """Queue ``node``'s task; it runs once a token is free. False if this pool already had it.

        ``timeout`` counts from dispatch (taking the token), not from queueing, so nodes queued
        behind a small concurrency are never timed out unfairly.
        """
        if node in self._nodes or self.closed.is_set():
            return False
        try:
            self._queue_in.send_nowait((node, work, timeout, on_end))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False
        self._nodes.add(node)
        return True

    async def _dispatch(self) -> None:
        # Node tasks take tokens strictly in the order they were started: each is started only once
        # the previous one holds its token (the scheduler alone would not keep that order).
        try:
            async for node, work, timeout, on_end in self._queue_out:
                await self._tg.start(self._run, node, work, timeout, on_end, name=f"node-task {self.uid}/{node}")
        finally:
            # Interrupted with nodes still queued: they never took a token, and they end here.
            self._queue_in.close()
            while True:
                try:
                    node, _, _, on_end = self._queue_out.receive_nowait()
                except (anyio.WouldBlock, anyio.EndOfStream):
                    break
                self._end(node, NodeTaskEnd.INTERRUPTED, on_end)
            self._queue_out.close()

    def _end(self, node: str, end: NodeTaskEnd, on_end: OnEnd | None) -> None:
        self.ended[node] = end
        if on_end is not None:
            on_end(node, end)

    def _close_queue(self) -> None:
        self._queue_in.close()

    async def _run(
        self,
        node: str,
        work: NodeWork,
        limit_s: float,
        on_end: OnEnd | None,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        end = NodeTaskEnd.INTERRUPTED
        holding = [False]
        _HOLDING.set(holding)
        try:
            await self._take(holding)
            task_status.started()
            try:
                with anyio.move_on_after(limit_s) as scope:
                    await work()
                    end = NodeTaskEnd.FINISHED
                if scope.cancelled_caught:
                    end = NodeTaskEnd.TIMED_OUT
            except anyio.get_cancelled_exc_class():
                raise
            except BaseException:
                end = NodeTaskEnd.FAILED
                raise
        finally:
            self._give(holding)
            self._end(node, end, on_end)

    async def _take(self, holding: list[bool]) -> None:
        await self._limiter.acquire()
        holding[0] = True
        self._in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self._in_flight)

    def _give(self, holding: list[bool]) -> None:
        if holding[0]:
            holding[0] = False
            self._in_flight -= 1
            self._limiter.release()

    @asynccontextmanager
    async def token_lent(self) -> AsyncIterator[None]:
        """Inside this block the calling node task gives its token to the next one queued, and takes one again
        (in turn, behind those already waiting) on leaving; cancelled meanwhile, it leaves without one.

        Only for a node task of this pool waiting on something outside it: the timeout still counts.
        """
        holding = _HOLDING.get()
        self._give(holding)
        try:
            yield
        finally:
            if not holding[0]:
                await self._take(holding)

    def interrupt(self) -> None:
        """Cancel every node task of the job; see :meth:`wait_closed` to wait for the unwinding."""
        self._tg.cancel_scope.cancel()

    async def wait_closed(self) -> None:
        """Return once all node tasks have unwound. Must not be awaited by a node task itself."""
        await self.closed.wait()


@asynccontextmanager
async def open_job_pool(*, uid: str, concurrency: int) -> AsyncIterator[JobPool]:
    """Open the pool of job ``uid``. Leaving the block waits for every started node task.

    Cancellation: cancelling the enclosing scope or calling :meth:`JobPool.interrupt` cancels all node
    tasks; the block is left only after each has released its token and reported its end.
    """
    pool: JobPool | None = None
    try:
        async with anyio.create_task_group() as tg:
            pool = JobPool(uid=uid, concurrency=concurrency, task_group=tg)
            tg.start_soon(pool._dispatch, name=f"dispatch {uid}")
            try:
                yield pool
            finally:
                pool._close_queue()
    finally:
        if pool is not None:
            pool.closed.set()
