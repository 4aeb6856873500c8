"""A queue of jobs each due at a moment of the event loop's clock, taken by a pool of workers.

Jobs due now are ready at once, and each wakes one worker, not all of them; jobs put ``first`` go
before every other ready job (one list that many nodes wait on, before one node's own). Jobs due
later wait in a heap that one timer task (:meth:`DelayQueue.run`) makes ready as they fall due.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from typing import Generic, TypeVar

import anyio
import anyio.abc

__all__ = ["DelayQueue"]

J = TypeVar("J")


class DelayQueue(Generic[J]):
    """Ready jobs (``first`` ones first, then in the order they became ready); :meth:`get` waits for one.

    Run :meth:`run` for as long as jobs are put with a delay.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, J, bool]] = []
        self._order = itertools.count()
        self._changed = anyio.Event()
        self._first: deque[J] = deque()
        self._rest: deque[J] = deque()
        self._ready = anyio.Semaphore(0)

    def __len__(self) -> int:
        return len(self._heap) + len(self._first) + len(self._rest)

    def put(self, job: J, delay: float = 0.0, *, first: bool = False) -> None:
        """Add ``job``, due ``delay`` seconds from now."""
        if delay <= 0:
            self._make_ready(job, first)
            return
        heapq.heappush(self._heap, (anyio.current_time() + delay, next(self._order), job, first))
        self._changed.set()

    async def get(self) -> J:
        """The next ready job, once there is one."""
        await self._ready.acquire()
        return (self._first or self._rest).popleft()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Make delayed jobs ready as they fall due, until cancelled."""
        task_status.started()
        while True:
            while self._heap and self._heap[0][0] <= anyio.current_time():
                _, _, job, first = heapq.heappop(self._heap)
                self._make_ready(job, first)
            if self._changed.is_set():
                self._changed = anyio.Event()
            wait = self._heap[0][0] - anyio.current_time() if self._heap else math.inf
            with anyio.move_on_after(wait):
                await self._changed.wait()

    def _make_ready(self, job: J, first: bool) -> None:
        (self._first if first else self._rest).append(job)
        self._ready.release()
