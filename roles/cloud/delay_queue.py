"""A queue of jobs each due at a moment of the event loop's clock, taken by a pool of workers.

Jobs due now go straight to the workers' stream, so a job wakes one worker, not all of them; jobs
due later wait in a heap that one timer task (:meth:`DelayQueue.run`) moves to the stream as they
fall due.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Generic, TypeVar

import anyio
import anyio.abc

__all__ = ["DelayQueue"]

J = TypeVar("J")


class DelayQueue(Generic[J]):
    """Jobs in the order they fall due (then the order they were put); :meth:`get` waits for the next.

    Run :meth:`run` for as long as jobs are put with a delay.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, J]] = []
        self._order = itertools.count()
        self._changed = anyio.Event()
        self._due, self._ready = anyio.create_memory_object_stream[J](math.inf)

    def __len__(self) -> int:
        return len(self._heap) + self._ready.statistics().current_buffer_used

    def put(self, job: J, delay: float = 0.0) -> None:
        """Add ``job``, due ``delay`` seconds from now."""
        if delay <= 0:
            self._due.send_nowait(job)
            return
        heapq.heappush(self._heap, (anyio.current_time() + delay, next(self._order), job))
        self._changed.set()

    async def get(self) -> J:
        """The next job due."""
        return await self._ready.receive()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Move delayed jobs to the workers as they fall due, until cancelled."""
        task_status.started()
        with self._due, self._ready:
            while True:
                while self._heap and self._heap[0][0] <= anyio.current_time():
                    self._due.send_nowait(heapq.heappop(self._heap)[2])
                if self._changed.is_set():
                    self._changed = anyio.Event()
                wait = self._heap[0][0] - anyio.current_time() if self._heap else math.inf
                with anyio.move_on_after(wait):
                    await self._changed.wait()
